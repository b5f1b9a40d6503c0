"""Print the docs/design.md §10 table (markdown) from bench/results/*.json.

    python bench/report.py > /tmp/table.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(*names):
    for name in names:
        p = RESULTS / f"{name}.json"
        if p.exists():
            return json.loads(p.read_text())
    return None


def fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float) and v >= 100:
        v = round(v)
    return f"{v:,}{unit}" if isinstance(v, int) else f"{v:,.2f}{unit}".replace(".00", "")


def row(figure, svc, base, target, better_lower=True, unit=""):
    if svc is None:
        met = "not measured"
    else:
        met = "yes" if (svc <= target if better_lower else svc >= target) else "**no**"
    ratio = "–"
    if svc and base:
        ratio = f"{(base / svc if better_lower else svc / base):.2f}×"
    tgt = ("≤ " if better_lower else "≥ ") + fmt(target, unit)
    return f"| {figure} | {fmt(svc, unit)} | {fmt(base, unit)} | {ratio} | {tgt} | {met} |"


def http_cell(data, size, system, cell):
    if not data:
        return None
    return (((data.get("sizes") or {}).get(str(size)) or {}).get(system) or {}).get(cell)


def line(figure, svc, base, tv, target, better_lower=True, unit=""):
    """| figure | service | baseline | tantivy | service vs tantivy | target | met |"""
    met = "not measured" if svc is None else (
        "yes" if (svc <= target if better_lower else svc >= target) else "**no**")
    vs_tv = "–"
    if svc and tv:
        vs_tv = f"{svc / tv:.1f}×" if better_lower else f"{svc / tv:.2f}×"
    tgt = ("≤ " if better_lower else "≥ ") + fmt(target, unit)
    return f"| {figure} | {fmt(svc, unit)} | {fmt(base, unit)} | {fmt(tv, unit)} | {vs_tv} | {tgt} | {met} |"


def main() -> None:
    """The issue 11 / docs/design.md §10 table from the read-index runs."""
    out = ["| figure | service | naive baseline | tantivy alone | service ÷ tantivy | target | met |",
           "|---|---|---|---|---|---|---|"]
    targets = {100_000: (2, 10, 1000), 1_000_000: (5, 25, 500)}
    for size, name in ((100_000, "search-100k"), (1_000_000, "search-1m")):
        # latency rows from the "-quiet" re-run when there is one (no rebuild, a quieter machine);
        # build, disk and agreement rows from the full run
        full = ((load(name) or {}).get("sizes") or {}).get(str(size)) or {}
        src = load(name + "-quiet") or load(name)
        s = ((src or {}).get("sizes") or {}).get(str(size))
        if not s:
            continue
        s = {**full, **{k: v for k, v in s.items()
                        if k not in ("read_index_build", "agreement_with_exact_lengths", "tantivy_build_units_per_s")}}
        if "baseline" not in s and "baseline" in full:
            s["baseline"] = full["baseline"]
        label = "100k" if size < 1_000_000 else "1M"
        note = f"{label} units, {s['shards']} days, load {src['machine']['loadavg_at_start'][0]}"
        p50, p99, _ = targets[size]
        for pct, tgt in (("p50_ms", p50), ("p99_ms", p99)):
            out.append(line(f"in-process search {pct[:3]}, {note}", s["service"][pct],
                            (s.get("baseline") or {}).get(pct), (s.get("tantivy") or {}).get(pct), tgt, unit=" ms"))
        worst = max(s.get("variants", {}).items(), key=lambda kv: kv[1]["p50_over_unfiltered"], default=None)
        if worst:
            out.append(line(f"filters/AND: slowest variant ({worst[0]}) p50 ÷ unfiltered, {label}",
                            worst[1]["p50_over_unfiltered"], None, None, 2.0, unit="×"))
        agree = s.get("agreement_with_exact_lengths") or {}
        if agree:
            out.append(f"| top-10 vs exact-length exhaustive BM25, {label} ({agree['queries']} queries) | "
                       f"score lists equal {agree['identical_score_lists']:.0%}; CIDs {agree['top10_overlap']:.1%}, "
                       f"{agree['top10_overlap_mod_ties_at_cut']:.1%} counting ties at the cut | – | – | – | ≥ 95 % | "
                       f"{'yes' if agree['top10_overlap_mod_ties_at_cut'] >= 0.95 else '**no**'} |")
        build = s.get("read_index_build") or {}
        if build:
            out.append(line(f"building the read index (from nothing), {label}", build["units_per_s"], None,
                            s.get("tantivy_build_units_per_s"), 20_000, better_lower=False, unit="/s"))
        disk = s.get("disk") or {}
        if disk:
            out.append(f"| disk per unit, {label}: read index | {fmt(disk['read_index_bytes_per_unit'])} B | – | – | – | "
                       f"< per-day replicas' {fmt(disk['previous_replica_bytes_per_unit'])} B | "
                       f"{'yes' if disk['read_index_bytes_per_unit'] < disk['previous_replica_bytes_per_unit'] else '**no**'} |")
    for size, names in ((100_000, ("http-100k-ri",)), (1_000_000, ("http-1m-ri",))):
        data = load(*names)
        if not data:
            continue
        label = ("100k" if size < 1_000_000 else "1M") + f", load {data['machine']['loadavg_at_start'][0]}"
        _, _, rps = targets[size]
        cells = [("search@64", f"HTTP search, 64 connections, {label}", rps)]
        if size == 1_000_000:
            cells.append(("mix@64", f"HTTP 90/10 search/push, 64 connections, {label}", 400))
        for cell, figure, tgt in cells:
            svc = http_cell(data, size, "service", cell)
            if svc:
                out.append(line(figure, svc["rps"], (http_cell(data, size, "baseline", cell) or {}).get("rps"),
                                (http_cell(data, size, "tantivy", cell) or {}).get("rps"), tgt,
                                better_lower=False, unit="/s"))
        ceiling = http_cell(data, size, "service", "healthz@64")
        if ceiling:
            out.append(f"| `GET /healthz` on the same server (the ceiling), {label} | {fmt(ceiling['rps'], '/s')} | – | "
                       f"{fmt((http_cell(data, size, 'tantivy', 'healthz@64') or {}).get('rps'), '/s')} | – | – | – |")
        entry = data["sizes"][str(size)]
        rss = entry.get("service_rss_mib") or {}
        if rss.get("worker"):
            anon = f", private (RssAnon) {max(rss['worker_anon'])} MiB" if rss.get("worker_anon") else ""
            out.append(line(f"peak RSS per worker under load, {label} (PSS {max(rss.get('worker_pss', [0]))} MiB{anon})",
                            max(rss["worker"]), max((entry.get("baseline_rss_mib") or {}).get("process", [0])) or None,
                            max((entry.get("tantivy_rss_mib") or {}).get("worker", [0])) or None, 200, unit=" MiB"))
    ingest = load("ingest-ri")
    if ingest:
        sl = ingest.get("service_index_lag", {})
        out.append(line(f"ack → found by a default search, p99, at {fmt(sl.get('achieved_units_per_s'))} pushed units/s",
                        (sl.get("lag") or {}).get("p99_ms"), (ingest.get("baseline_index_lag", {}).get("lag") or {}).get("p99_ms"),
                        None, 2000, unit=" ms"))
    print("\n".join(out))


def plot_scale() -> None:
    """results/search-scale.png: p50 and p99 against corpus size, log-log, for the service, the naive
    baseline and tantivy alone (from search-100k.json and search-1m.json)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {100_000: load("search-100k"), 1_000_000: load("search-1m")}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, color in (("service", "tab:blue"), ("baseline", "tab:red"), ("tantivy", "tab:green")):
        for pct, ls in (("p50_ms", "-"), ("p99_ms", "--")):
            pts = [(size, run["sizes"][str(size)][system][pct]) for size, run in runs.items()
                   if run and system in run["sizes"].get(str(size), {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", ls=ls, color=color, label=f"{system} {pct[:3]}")
    for size, (p50, p99) in ((100_000, (2, 10)), (1_000_000, (5, 25))):
        ax.scatter([size, size], [p50, p99], marker="_", s=300, color="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("units (log)")
    ax.set_ylabel("in-process search latency, ms (log)")
    ax.set_title("search latency vs corpus size (grey: targets)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "search-scale.png", dpi=110)


if __name__ == "__main__":
    if "--plot" in sys.argv:
        plot_scale()
    sys.exit(main())
