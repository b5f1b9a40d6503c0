"""Tool search quality and speed: recall@k of BM25 tool search on the judged set.

bench/data/tools.jsonl (500 tools, bench/tooldata.py) is registered through the Python client into a
fresh gunicorn; each of bench/data/tool_queries.json's paraphrased requests is asked once with
``find_tools`` (GET /mcp/tools?q=, top 10) and scored by where its one relevant tool ranks: recall@1,
@5, @10 and MRR@10, plus the HTTP latency of the searches. Then, in-process, the same queries under
other column weights, split into the two halves used to choose them (even-numbered queries: dev,
odd: test), so the choice in service/store/sqlite/registry.py can be checked. Runs in well under a minute.

    .venv/bin/python bench/tools.py
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import BENCH, TMP, app_parts, machine, r, service_rev, service_src, summary, write_json

DATA = BENCH / "data"
WEIGHT_GRID = [(2.0, 1.0, 0.5), (1.0, 1.0, 0.5), (1.0, 1.0, 1.0), (0.5, 1.0, 0.5), (0.5, 1.0, 0.25),
               (0.25, 1.0, 0.25), (0.0, 1.0, 0.0), (1.0, 0.0, 0.0)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def score(ranked: list[list[str]], judged: list[dict]) -> dict:
    ranks = [(names.index(q["tool"]) + 1 if q["tool"] in names else None) for names, q in zip(ranked, judged)]
    n = len(judged)
    return {"queries": n, "recall@1": r(sum(k == 1 for k in ranks) / n, 3),
            "recall@5": r(sum(bool(k and k <= 5) for k in ranks) / n, 3),
            "recall@10": r(sum(bool(k and k <= 10) for k in ranks) / n, 3),
            "mrr@10": r(sum(1 / k for k in ranks if k) / n, 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="tools")
    args = ap.parse_args(argv)
    src = service_src(args.service_src)
    catalogue = [json.loads(line) for line in (DATA / "tools.jsonl").read_text(encoding="utf-8").splitlines()]
    judged = json.loads((DATA / "tool_queries.json").read_text(encoding="utf-8"))

    # 1. Over HTTP, as an agent would: the Python client against gunicorn.
    from context_mode_client import ContextModeClient
    data_dir = TMP / f"tools-{os.getpid()}"
    shutil.rmtree(data_dir, ignore_errors=True)
    port = free_port()
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(data_dir), PYTHONPATH=str(src),
               CONTEXT_RATE_LIMIT="off", CONTEXT_ACCESS_LOG="0")
    TMP.mkdir(parents=True, exist_ok=True)
    log = open(TMP / f"{args.name}-server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", "service/gunicorn_conf.py",
                             "service:create_app()"], cwd=src, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        cm = ContextModeClient(f"http://127.0.0.1:{port}", retries=20, backoff=0.2)
        deadline = time.time() + 60
        while True:
            try:
                cm.session.get(cm.url + "/healthz", timeout=2).raise_for_status()
                break
            except Exception:  # noqa: BLE001 - still starting
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        t0 = time.perf_counter()
        for tool in catalogue:
            cm.register_tool(tool)
        register_s = time.perf_counter() - t0
        ranked, took = [], []
        for _ in range(3):
            ranked = []
            for q in judged:
                t = time.perf_counter()
                ranked.append([x["name"] for x in cm.find_tools(q["query"], top_k=10)])
                took.append((time.perf_counter() - t) * 1000)
        http = score(ranked, judged)
        misses = [{"query": q["query"], "tool": q["tool"], "got": names[:3]}
                  for names, q in zip(ranked, judged) if q["tool"] not in names[:5]]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)

    # 2. In-process: the column weights, on the dev and test halves.
    from service import create_app
    from service.store.sqlite import registry as registry_mod
    app = create_app({"data_dir": str(data_dir / "inproc"), "background": False, "access_log": False})
    reg = app_parts(app).registry
    for tool in catalogue:
        reg.create("default", tool)
    chosen = dict(registry_mod.WEIGHTS)
    grid = []
    for w in WEIGHT_GRID:
        registry_mod.WEIGHTS = dict(zip(("name", "text", "schema"), w))
        ranked_w = [[x["name"] for x in reg.search("default", q["query"], top_k=10)] for q in judged]
        grid.append({"weights": dict(registry_mod.WEIGHTS), "chosen": registry_mod.WEIGHTS == chosen,
                     "dev": score(ranked_w[0::2], judged[0::2]), "test": score(ranked_w[1::2], judged[1::2]),
                     "all": score(ranked_w, judged)})
    registry_mod.WEIGHTS = chosen
    app_parts(app).shutdown()
    shutil.rmtree(data_dir, ignore_errors=True)

    out = {"name": args.name, "service_rev": service_rev(src), "machine": machine(),
           "tools": len(catalogue), "queries": len(judged), "weights": chosen,
           "http": {**http, "register_500_s": r(register_s, 2), "search_latency": summary(took)},
           "misses_at_5": misses, "weight_grid": grid}
    write_json(args.name, out)
    print(f"{len(catalogue)} tools, {len(judged)} judged paraphrases, weights {chosen}")
    print(f"  over HTTP: recall@1 {http['recall@1']}  recall@5 {http['recall@5']}  recall@10 {http['recall@10']}"
          f"  MRR@10 {http['mrr@10']}; search p50 {out['http']['search_latency']['p50_ms']} ms"
          f" p99 {out['http']['search_latency']['p99_ms']} ms; 500 registrations {r(register_s, 1)} s")
    for g in grid:
        w = g["weights"]
        print(f"  weights name {w['name']:<4} text {w['text']:<4} schema {w['schema']:<4}"
              f" R@5 dev {g['dev']['recall@5']:.3f} test {g['test']['recall@5']:.3f} all {g['all']['recall@5']:.3f}"
              f"{'   <- chosen' if g['chosen'] else ''}")


if __name__ == "__main__":
    main()
