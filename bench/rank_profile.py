"""The ranking of a default search, stage by stage, in process (issue 53): the cached corpus's read index
searched with whole questions (corpus.questions) through the store, every stage of service/ranking/rank.py
timed by wrapping it (time.perf_counter_ns), so the shares add up to one search's wall time on one thread.

Stages: ``tantivy`` (the engine's query: index.search, and the best k of a corpus without threads),
``pool fields`` (candidates' fast fields), ``neighbors`` (places read by their thread key), ``evidence``
(Evidence made, the neighbors' places, naming), ``contenders`` (the combined estimate, sorted), ``gone``
(deleted since the index: the store's catalog), ``exact`` (BM25 from stored tokens), ``combine`` (the
combined score, heads, order), and what is left of a search (``rest``: parsing, the store's statistics,
read-your-writes, shaping the answer).

    python bench/rank_profile.py --size 100000 --searches 1500 --builds f0a639c,worktree --rounds 4 \
        --name rank-profile-100k
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from common import app_parts, machine, quiet_service_logs, service_rev, service_src, write_json

SPENT: dict[str, int] = defaultdict(int)
CALLS: dict[str, int] = defaultdict(int)


def timed(owner, attr: str, stage: str) -> None:
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[stage] += time.perf_counter_ns() - t0
            CALLS[stage] += 1
    setattr(owner, attr, staticmethod(wrapper) if isinstance(owner.__dict__.get(attr), staticmethod) else wrapper)


def instrument() -> None:
    from service.ranking import rank, threads
    from service.readindex import searcher, threaded
    timed(searcher, "search", "pool_tantivy")
    timed(threaded.Engine, "pool", "pool")
    timed(threaded.Engine, "bm25_best", "tantivy")
    timed(threaded.Engine, "places", "neighbors")
    timed(threaded.Engine, "exact", "exact")
    timed(threads.Evidence, "add", "evidence")
    timed(threads.Evidence, "missing_neighbors", "evidence")
    timed(threads.Naming, "mark", "evidence")
    timed(threads.Evidence, "contenders", "contenders")
    timed(threads.Evidence, "sources", "contenders")
    timed(rank, "_combined", "combine")
    timed(rank, "rank", "rank")
    timed(threads, "Evidence", "evidence")
    rank.Evidence = threads.Evidence


def run(size: int, searches: int, seed: int) -> dict:
    from corpus import questions, service_dir
    from service import create_app
    from service.params import parse_search
    app = create_app({"data_dir": str(service_dir(size, seed)), "background": False})
    store, cfg = app_parts(app).store, app.config["CONTEXT"]
    qs = questions(searches, seed)
    params = [parse_search({"query": q, "top_k": 10}, cfg) for q in qs]
    for p in params[:200]:
        store.search("default", p)
    instrument()
    SPENT.clear()
    CALLS.clear()
    t0 = time.perf_counter_ns()
    for p in params:
        store.search("default", p)
    wall = time.perf_counter_ns() - t0
    app_parts(app).shutdown()
    return report(wall, len(params))


def report(wall: int, n: int) -> dict:
    spent = dict(SPENT)
    stages = {}
    rank_total = spent.pop("rank", 0)
    for name in ("tantivy", "pool", "neighbors", "evidence", "contenders", "exact", "combine"):
        stages[name] = spent.get(name, 0)
    stages["tantivy"] += spent.get("pool_tantivy", 0)
    stages["pool fields"] = stages.pop("pool") - spent.get("pool_tantivy", 0)
    stages["combine"] -= stages["exact"]
    stages["ranking, other"] = rank_total - sum(stages.values())
    stages["rest of the search"] = wall - rank_total
    out = {"searches": n, "wall_ms_per_search": round(wall / n / 1e6, 4),
           "stages_us_per_search": {k: round(v / n / 1e3, 1) for k, v in stages.items()},
           "share": {k: round(v / wall, 3) for k, v in stages.items()}}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--searches", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--builds", default="worktree", help="service builds, comma separated (head, worktree, a "
                    "commit): each in a process of its own, alternating")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--name", default="rank-profile")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        service_src(a.one)
        quiet_service_logs()
        print(json.dumps(run(a.size, a.searches, a.seed)))
        return
    builds = a.builds.split(",")
    runs: dict[str, list[dict]] = {b: [] for b in builds}
    for r in range(a.rounds):
        for b in (builds if r % 2 == 0 else builds[::-1]):
            print(f"round {r + 1}: {b}", flush=True)
            done = subprocess.run([sys.executable, __file__, "--one", b, "--size", str(a.size), "--searches",
                                   str(a.searches), "--seed", str(a.seed)], check=True, capture_output=True, text=True)
            runs[b].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = {"machine": machine(), "size": a.size, "searches": a.searches, "rounds": a.rounds, "builds": {}}
    for b in builds:
        med = {k: statistics.median(x["stages_us_per_search"][k] for x in runs[b]) for k in runs[b][0]["stages_us_per_search"]}
        wall = statistics.median(x["wall_ms_per_search"] for x in runs[b])
        out["builds"][b] = {"service": service_rev(service_src(b)), "wall_ms_per_search": wall,
                            "stages_us_per_search": med, "runs": runs[b]}
        print(f"{b}: {wall:.3f} ms per search (median of {a.rounds})")
        for k, v in med.items():
            print(f"  {k:20s} {v:8.1f} us")
    write_json(a.name, out)


if __name__ == "__main__":
    main()
