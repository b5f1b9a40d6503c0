"""Two builds of the service, the same answers to the float: every query's top k (CIDs in order, raw BM25
scores as exact hexadecimal floats) from an old and a new build on the same data, default and strong
searches, on SQLite and on PostgreSQL. For changes that must not move a score (a refactor of the ranking
code): any difference is printed and counted.

    .venv/bin/python bench/score_identity.py --old 97de0de [--new worktree] [--size 100000] [--pg-size 20000]
        [--queries 300] [--name score-identity]

SQLite reads corpus.py's cached data folder of --size units; PostgreSQL gets --pg-size units of the same
generator pushed into a throwaway primary + standby (tools/pg_cluster.py). Each build runs in a process of
its own (its ``service`` first on sys.path); the raw scores are read where both stores hand their winners to
``shape_results``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from common import TMP, app_parts, machine, service_rev, service_src, write_json

STORES = {"sqlite": "service.store.sqlite.search", "postgresql": "service.store.postgresql.search"}


def dump(a) -> None:
    """In a build's own process: every query's winners as (cid, score.hex()), per store and kind."""
    import importlib
    src = service_src(a.rev)
    from common import quiet_service_logs
    quiet_service_logs()
    from corpus import queries, questions
    from service import create_app
    from service.params import parse_search
    winners: list = []
    out = {"service_rev": service_rev(src), "stores": {}}
    for name, module in STORES.items():
        if name not in a.stores.split(","):
            continue
        mod = importlib.import_module(module)
        shape = mod.shape_results

        def recording(p, terms, ranked, stats, tokenizer, _shape=shape):
            ranked.sort(key=lambda r: r.order)
            winners.append([[getattr(r, "cid", None) or r.unit["cid"], float(r.score).hex()] for r in ranked[:p.top_k]])
            return _shape(p, terms, ranked, stats, tokenizer)
        mod.shape_results = recording
        config = {"data_dir": a.sqlite_dir, "background": False, "search_cpu_ms": 0}
        if name == "postgresql":
            config.update(data_dir=str(TMP / f"identity-pg-app-{out['service_rev']}"), store=a.pg_primary,
                          store_replica=a.pg_standby)
        app = create_app(config)
        if name == "postgresql":
            maint = app_parts(app).maintenance
            while maint.run_once() or maint.sync_read_indexes():
                pass
        store, cfg = app_parts(app).store, app.config["CONTEXT"]
        res = out["stores"][name] = {}
        qs = queries(a.queries, 1) + questions(a.queries, 1)
        for kind, extra in (("default", {}), ("strong", {"consistency": "strong"})):
            winners.clear()
            for q in qs:
                before = len(winners)
                store.search("default", parse_search({"query": q, "top_k": a.top_k, **extra}, cfg))
                if len(winners) == before:          # (no result at all: shape_results was not reached)
                    winners.append([])
            res[kind] = dict(zip(qs, winners))
        app_parts(app).shutdown()
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False)


def build_pg(size: int) -> tuple:
    """A primary and a standby holding ``size`` units of the bench generator, indexed."""
    from postgresql import build
    from servers import pg_cluster
    from corpus import Generator
    from service import create_app
    cluster = pg_cluster(TMP / "identity-pg-cluster")
    app = create_app({"data_dir": str(TMP / "identity-pg-build"), "background": False,
                      "store": cluster.primary_url, "store_replica": cluster.standby_url})
    build(app, list(Generator(1).units(size)))
    app_parts(app).shutdown()
    time.sleep(2)              # the standby replays the build
    return cluster


def compare(old: dict, new: dict) -> dict:
    report = {}
    for store, kinds in old["stores"].items():
        for kind, tops in kinds.items():
            other = new["stores"][store][kind]
            diff = [q for q, top in tops.items() if other.get(q) != top]
            report[f"{store}/{kind}"] = {"queries": len(tops), "identical": len(tops) - len(diff),
                                         "differ": diff[:20]}
            print(f"{store:10s} {kind:7s} identical top {len(tops) - len(diff)} of {len(tops)}"
                  + (f"  first differing query: {diff[0]!r}" if diff else ""), flush=True)
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=False)
    ap.add_argument("--new", default="worktree")
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--pg-size", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=300, help="of each kind: short queries and whole questions")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--name", default="score-identity")
    # (internal: one build's dump)
    ap.add_argument("--rev", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--sqlite-dir", help=argparse.SUPPRESS)
    ap.add_argument("--pg-primary", help=argparse.SUPPRESS)
    ap.add_argument("--pg-standby", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rev:
        return dump(a)
    service_src(a.new)
    from corpus import service_dir
    sqlite_dir = str(service_dir(a.size))
    cluster = build_pg(a.pg_size) if "postgresql" in a.stores else None
    try:
        dumps = {}
        for label, rev in (("old", a.old), ("new", a.new)):
            path = TMP / f"identity-{label}.json"
            cmd = [sys.executable, __file__, "--rev", rev, "--out", str(path), "--sqlite-dir", sqlite_dir,
                   "--queries", str(a.queries), "--top-k", str(a.top_k), "--stores", a.stores]
            if cluster is not None:
                cmd += ["--pg-primary", cluster.primary_url, "--pg-standby", cluster.standby_url]
            subprocess.run(cmd, check=True)
            dumps[label] = json.loads(path.read_text())
        report = compare(dumps["old"], dumps["new"])
    finally:
        if cluster is not None:
            cluster.stop()
    write_json(a.name, {"machine": machine(), "old": dumps["old"]["service_rev"], "new": dumps["new"]["service_rev"],
                        "size": a.size, "pg_size": a.pg_size, "report": report})


if __name__ == "__main__":
    main()
