"""Seeing and managing the memory at scale: list pages, stats, export, forget, compaction.

In-process on a *copy* of the cached service corpus (bench/corpus.py; forgetting changes it), so the
figures are the store's own cost, without HTTP. Also default searches before a forget, right after it
(the read index still holds the forgotten units; the catalog check drops them) and after the
leader's next pass. Writes results/manage.json.

    .venv/bin/python bench/manage.py --size 100000
"""
from __future__ import annotations

import argparse
import shutil
import time

from common import TMP, app_parts, machine, quiet_service_logs, service_rev, service_src, summary, write_json


def timed(fn, n: int, max_s: float = 30.0) -> list[float]:
    out, end = [], time.monotonic() + max_s
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
        if time.monotonic() > end:
            break
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="manage")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    quiet_service_logs()
    from corpus import queries, service_dir
    from service import create_app
    from service.store.sqlite import manage
    from service.params import parse_search

    cached = service_dir(a.size, a.seed)
    d = TMP / f"manage-copy-n{a.size}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(cached, d)
    app = create_app({"data_dir": str(d), "background": False, "replica_debounce_ms": 0})
    store = app_parts(app).store
    maint = app_parts(app).maintenance
    cfg = app.config["CONTEXT"]
    maint.run_once()
    t = store.tenant("default")
    out: dict = {"machine": machine(), "service_rev": service_rev(src), "size": a.size, "results": {}}
    res = out["results"]

    def filters(**body):
        return parse_search({"query": "", **body}, cfg)

    def show(name, lat):
        res[name] = summary(lat)
        print(f"  {name:<42} p50 {res[name]['p50_ms']:>8} ms  p99 {res[name]['p99_ms']:>8} ms  (n={len(lat)})")

    print(f"== list, stats, export, forget on {a.size} units ({len(t.live_days())} days)")
    sample = manage.list_units(store, "default", filters(), 200)[0]
    some_source = sample[0]["source"]
    prefix = some_source.split("_")[0] + "_*"
    show("list: first page of 50", timed(lambda: manage.list_units(store, "default", filters(), 50), a.repeat))
    show("list: first page of 200", timed(lambda: manage.list_units(store, "default", filters(), 200), a.repeat))
    show("list: types=system_notice (10 %), 50", timed(
        lambda: manage.list_units(store, "default", filters(types=["system_notice"]), 50), a.repeat))
    show(f"list: source={prefix}, 50", timed(
        lambda: manage.list_units(store, "default", filters(source=prefix), 50), a.repeat))

    def deep():
        before = None
        for _ in range(20):
            _, before = manage.list_units(store, "default", filters(), 50, before)
    show("list: 20 pages of 50 by cursor", timed(deep, 10))

    def cold():
        manage._stats_cache.clear()
        manage.stats(store, "default")
    show("stats: cold (every day file grouped)", timed(cold, 5))
    show("stats: warm (no day file changed)", timed(lambda: manage.stats(store, "default"), a.repeat))

    t0 = time.perf_counter()
    n = sum(1 for _ in manage.export_units(store, "default", filters()))
    export_s = time.perf_counter() - t0
    res["export"] = {"units": n, "seconds": round(export_s, 2), "units_per_s": round(n / export_s)}
    print(f"  export: {n} units in {export_s:.1f} s ({n / export_s:.0f}/s)")

    q = queries(5, a.seed)
    show("forget dry run: source prefix", timed(
        lambda: manage.matches(store, "default", filters(source=prefix)), 5))
    show(f"forget dry run: query {q[0]!r} (and)", timed(
        lambda: manage.matches(store, "default", parse_search({"query": q[0], "operator": "and"}, cfg)), 5))

    def search_p50(label):
        lat = timed(lambda: [store.search("default", parse_search({"query": x, "top_k": 10}, cfg)) for x in q], a.repeat)
        show(label, [x / len(q) for x in lat])
    search_p50("search: before forgetting")
    found = manage.matches(store, "default", filters(source=some_source))
    by_day: dict = {}
    for r in found:
        by_day.setdefault(r["day"], []).append(r["cid"])
    t0 = time.perf_counter()
    removed = manage.remove(store, "default", by_day)
    res["forget"] = {"units": removed, "seconds": round(time.perf_counter() - t0, 3)}
    print(f"  forget {removed} units of source {some_source}: {res['forget']['seconds']} s")
    search_p50(f"search: {removed} forgotten, before the pass")
    t0 = time.perf_counter()
    maint.run_once()
    res["read_index_pass_after_forget_s"] = round(time.perf_counter() - t0, 3)
    search_p50("search: after the read index's pass")

    # compaction: forget a tenth of the largest day, then the janitor
    day = max(t.primary_days(), key=lambda dd: (d / "tenants" / "default" / "primary" / f"{dd}.db").stat().st_size)
    path = d / "tenants" / "default" / "primary" / f"{day}.db"
    day_rows = t.shard(day).read(lambda c: c.execute("SELECT cid FROM units").fetchall())
    cut = [r[0] for r in day_rows[: max(1, len(day_rows) // 9)]]
    manage.remove(store, "default", {day: cut})
    t.shard(day).read(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    size_before = path.stat().st_size
    t0 = time.perf_counter()
    maint.janitor.run(t)
    res["compaction"] = {"day_units": len(day_rows), "forgotten": len(cut), "seconds": round(time.perf_counter() - t0, 2),
                         "bytes_before": size_before, "bytes_after": path.stat().st_size,
                         "compacted": maint.janitor.compacted}
    print(f"  janitor after forgetting {len(cut)} of {len(day_rows)} units of {day}: {res['compaction']['seconds']} s, "
          f"{size_before / 1e6:.1f} -> {path.stat().st_size / 1e6:.1f} MB")
    app_parts(app).shutdown()
    shutil.rmtree(d, ignore_errors=True)
    write_json(a.name, out)


if __name__ == "__main__":
    main()
