"""What each per-request layer costs (issue 42 item 3): the service with one layer taken out at a time, beside
the bare app (bench/bare_app.py) and the service as it is, every server up at once and measured in
alternating cells (bench/http_bench.py's ``run_alternating``): ``GET /healthz`` at 64 connections, which does
no work of its own, so what it costs is the request path. With ``--search`` also whole questions at 64
connections on the service with and without keys (authentication) and the rate limiter, and the bare app.

The layers (bench/layers_app.py and bench/layers_conf.py take them out; nothing of it is a setting of the
service): the slow-client guard (service/guard/), the access line (CONTEXT_ACCESS_LOG=0), the
request histogram with it (service/metrics.py), the door checks and CORS (service/doors.py), the rate
limiter (service/ratelimit.py: off without keys by default, so it is measured added, with a limit no cell
reaches), and keys (service/auth.py: the same, added).

    python bench/layers.py --rounds 3 --duration 10 --name layers
    python bench/layers.py --rounds 3 --duration 10 --search --name layers-search
    python bench/layers.py --variants service --old eb47249 --search --name layers-before-after
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from functools import partial

import http_bench as H
from common import BENCH, TMP, machine, service_rev, service_src, write_json

KEY = "layers-bench-key-0123456789"
ROOMY_LIMIT = "100000000/minute"        # the limiter's work, never its 429
# name -> (LAYERS_OFF, environment)
VARIANTS = {
    "service": ("", {}),
    "-guard": ("guard", {}),
    "-access_line": ("", {"CONTEXT_ACCESS_LOG": "0"}),
    "-metrics": ("metrics", {}),
    "-doors": ("doors", {}),
    "+limiter": ("", {"CONTEXT_RATE_LIMIT": ROOMY_LIMIT}),
    "+keys": ("", {"CONTEXT_API_KEYS": f"{KEY}:default:push+search", "CONTEXT_RATE_LIMIT": "off"}),
    "+keys+limiter": ("", {"CONTEXT_API_KEYS": f"{KEY}:default:push+search", "CONTEXT_RATE_LIMIT": ROOMY_LIMIT}),
    "none": ("guard,metrics,doors", {"CONTEXT_ACCESS_LOG": "0"}),
}
SEARCHED = ("service", "+keys", "+keys+limiter")


def start_variant(src, data_dir, off: str, env: dict, port: int):
    app_dir = TMP / "layers-app"       # its own folder on the path (bench/ holds a profile.py)
    app_dir.mkdir(parents=True, exist_ok=True)
    for name in ("layers_app.py", "layers_conf.py"):
        shutil.copy(BENCH / name, app_dir / name)
    return H.start_gunicorn(src, "layers_app:create_app()", port, f"layers-{port}.log",
                            f"{src}{os.pathsep}{app_dir}", conf=str(app_dir / "layers_conf.py"),
                            CONTEXT_DATA_DIR=str(data_dir), LAYERS_OFF=off, LAYERS_SRC=str(src), **env)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--search", action="store_true", help="also whole questions @64 (service, keys, limiter)")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--old", help="also this build of the service as it is (before/after in the same run)")
    ap.add_argument("--name", default="layers")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    from corpus import service_dir
    corpus = service_dir(a.size, a.seed)
    plain = H.write_inputs(a.seed, nonce=f"l{int(time.time())}", kind="questions")
    keyed = H.write_inputs(a.seed, nonce=f"l{int(time.time())}", kind="questions", key=KEY)
    run = TMP / "run-layers"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    servers = []
    for name in a.variants.split(","):
        off, env = VARIANTS[name]
        data = run / name
        workloads = {"healthz"}
        if a.search and name in SEARCHED:
            shutil.copytree(corpus, data)
            workloads.add("search")
        else:
            data.mkdir()
        server = H.Server(name, partial(start_variant, src, data, off, env), workloads)
        server.keyed = "CONTEXT_API_KEYS" in env
        servers.append(server)
    if a.old:
        old = service_src(a.old)
        data = run / "old"
        if a.search:
            shutil.copytree(corpus, data)
        else:
            data.mkdir()
        server = H.Server(f"old {a.old}", partial(H.start_service, old, data), {"healthz", "search"} if a.search
                          else {"healthz"})
        server.keyed = False
        servers.insert(1, server)
    import bare_app
    bare_app.build(corpus, run / "bare")
    bare = H.Server("bare", partial(H.start_bare, src, run / "bare"), {"healthz", "search"} if a.search else {"healthz"})
    bare.keyed = False
    servers.append(bare)
    cells = [("healthz", 64)] + ([("search", 64)] if a.search else [])
    out = {"machine": machine(), "service_rev": service_rev(src), "duration_s": a.duration, "rounds": a.rounds,
           "load_at_start": os.getloadavg(), "variants": {n: {"off": VARIANTS[n][0], "env": VARIANTS[n][1]}
                                                          for n in a.variants.split(",")}}
    try:
        H.run_alternating(servers, cells, {"healthz": plain["healthz"], "search": plain["search"]}, a.duration,
                          a.rounds, scripts_of=lambda s: keyed if s.keyed else plain)
        out["results"] = {s.name: H.medians(s.cells) for s in servers}
    finally:
        for s in servers:
            if s.proc is not None:
                H.stop(s.proc)
        shutil.rmtree(run, ignore_errors=True)
    res = out["results"]
    summary = {}
    for cell in [f"{w}@{n}" for w, n in cells]:
        base = res["bare"][cell]["rps"]
        summary[cell] = {name: {"rps": r[cell]["rps"], "over_bare": round(r[cell]["rps"] / base, 3),
                                "cpu_ms": r[cell]["server_cpu_ms_per_request"]}
                         for name, r in res.items() if cell in r}
    out["summary"] = summary
    print(json.dumps(summary, indent=1))
    write_json(a.name, out)


if __name__ == "__main__":
    main()
