"""Worker and maintainer memory with glibc's malloc arenas capped at 2 (the service's default since
issue 17, service/boot.py) or left at glibc's default (MALLOC_ARENA_MAX=8 per core), alternating, on
copies of the same corpus: RSS, PSS and private (anonymous) MiB per process when idle, after 5 s of
50 closed-loop writers, and after a batch ingest over HTTP.

    python bench/arenas.py --size 100000 --rounds 2 --ingest-units 20000
"""
from __future__ import annotations

import argparse
import os
import shutil
import time

import write as W
from common import TMP, machine, service_rev, service_src, write_json

VARIANTS = {"capped (default)": {}, "glibc default": {"MALLOC_ARENA_MAX": str(8 * (os.cpu_count() or 1))}}


def memory(root_pid: int) -> dict:
    import psutil
    out: dict = {}
    for p in psutil.Process(root_pid).children(recursive=True):
        role = W.H.role_of(p.pid, root_pid)
        if role not in ("worker", "maintainer"):
            continue
        full = p.memory_full_info()
        with open(f"/proc/{p.pid}/status") as fh:
            anon = next(int(x.split()[1]) // 1024 for x in fh if x.startswith("RssAnon:"))
        out.setdefault(role, []).append({"rss": round(full.rss / 2**20), "pss": round(full.pss / 2**20), "anon": anon})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ingest-units", type=int, default=20_000)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="arenas")
    a = ap.parse_args(argv)
    from corpus import service_dir
    from ingest import http_batch_ingest
    src = service_src(a.service_src)
    W.H.write_inputs(a.seed, nonce=f"a{int(time.time())}")
    units = W.ingest_units(a.ingest_units, a.seed)
    runs = []
    for rnd in range(a.rounds):
        names = list(VARIANTS) if rnd % 2 == 0 else list(VARIANTS)[::-1]
        for name in names:
            d = TMP / "run-arenas"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(service_dir(a.size, a.seed), d / "service")
            port = W.H.free_port()
            proc = W.H.start_gunicorn(src, "service:create_app()", port, "http-service.log", str(src),
                                      CONTEXT_DATA_DIR=str(d / "service"), **VARIANTS[name])
            try:
                W.H.wait_ready(port, 180)
                W.H.wrk(TMP / "http-push.lua", port, 8, 2)
                W.H.wait_idle(proc.pid)
                row = {"round": rnd, "variant": name, "idle": memory(proc.pid)}
                W.H.wrk(TMP / "http-push.lua", port, 50, 5)
                W.H.wait_idle(proc.pid)
                row["after_pushes"] = memory(proc.pid)
                http_batch_ingest(port, [dict(u) for u in units], clients=4)
                W.H.wait_idle(proc.pid, 120)
                time.sleep(2)
                row["after_ingest"] = memory(proc.pid)
            finally:
                W.H.stop(proc)
            runs.append(row)
            print(f"{rnd} {name:17s} " + "  ".join(
                f"{k}: " + ", ".join(f"{r} " + "/".join(str(m['rss']) for m in row[k].get(r, []))
                                     for r in ("worker", "maintainer"))
                for k in ("idle", "after_pushes", "after_ingest")) + "  (RSS MiB)", flush=True)
    write_json(a.name, {"machine": machine(), "service_rev": service_rev(src), "size": a.size, "runs": runs})


if __name__ == "__main__":
    main()
