"""Print the DESIGN.md section 10 table (markdown) from bench/results/*.json.

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


def main() -> None:
    search = load("search")
    # The newest run of each script first: *-lists = with impact lists in past-day replicas.
    http_by_size = {100_000: load("http-100k", "http"),
                    1_000_000: load("http-1m-lists", "http-1m-end", "http-1m", "http")}
    ingest = load("ingest-lists", "ingest-end", "ingest")
    out = ["| figure (DESIGN.md §10) | service | baseline | service advantage | target | met |",
           "|---|---|---|---|---|---|"]
    for src in (search, load("search-end"), load("search-lists")):
        for size in (100_000, 1_000_000):
            s = ((src or {}).get("sizes") or {}).get(str(size))
            if not s:
                continue
            label = f"{size // 1000}k" if size < 1_000_000 else "1M"
            note = "" if size == 1_000_000 else " (informative)"
            rev = f", service `{src['service_rev']}`, load {src['machine']['loadavg_at_start'][0]}"
            out.append(row(f"in-process search p50, {label} units, {s['shards']} shards{rev}{note}",
                           s["service"]["p50_ms"], (s.get("baseline") or {}).get("p50_ms"), 15, unit=" ms"))
            out.append(row(f"in-process search p99, {label} units{rev}{note}", s["service"]["p99_ms"],
                           (s.get("baseline") or {}).get("p99_ms"), 80, unit=" ms"))
    for size, data in http_by_size.items():
        label = "1M" if size == 1_000_000 else "100k"
        note = "" if size == 1_000_000 else " (informative)"
        if data:
            label += f", service `{data['service_rev']}`, load {data['machine']['loadavg_at_start'][0]}"
        svc = http_cell(data, size, "service", "search@64")
        base = http_cell(data, size, "baseline", "search@64")
        if svc:
            out.append(row(f"HTTP search throughput, 64 clients, {label}{note}", svc["rps"], (base or {}).get("rps"),
                           800, better_lower=False, unit="/s"))
        svc = http_cell(data, size, "service", "push@50")
        base = http_cell(data, size, "baseline", "push@50")
        if svc:
            out.append(row(f"push ack p95, 50 concurrent writers, {label}", svc["p95"], (base or {}).get("p95"),
                           10, unit=" ms"))
        entry = ((data or {}).get("sizes") or {}).get(str(size)) or {}
        if entry.get("service_rss_mib"):
            svc = max(entry["service_rss_mib"].get("worker", [0]))
            base = max((entry.get("baseline_rss_mib") or {}).get("process", [0])) or None
            out.append(row(f"peak RSS per worker under load, {label}{note}", svc, base, 150, unit=" MiB"))
    if ingest:
        si, bi = ingest.get("service_inprocess", {}), ingest.get("baseline_inprocess", {})
        out.append(f"| *ingest rows below: service `{ingest['service_rev']}`, load {ingest['machine']['loadavg_at_start'][0]}* | | | | | |")
        out.append(row("batch ingest to durable storage, in-process (batches of 1000)", si.get("push_units_per_s"),
                       bi.get("push_units_per_s"), 10_000, better_lower=False, unit="/s"))
        sh, bh = ingest.get("service_http_batch", {}), ingest.get("baseline_http_batch", {})
        out.append(row("batch ingest to durable storage, HTTP (1000/request, 2 clients)", sh.get("units_per_s"),
                       bh.get("units_per_s"), 10_000, better_lower=False, unit="/s"))
        sl, bl = ingest.get("service_index_lag", {}), ingest.get("baseline_index_lag", {})
        out.append(row(f"index lag p99 (ack → searchable on replica) at {fmt(sl.get('achieved_units_per_s'))} units/s",
                       (sl.get("lag") or {}).get("p99_ms"), (bl.get("lag") or {}).get("p99_ms"), 2000, unit=" ms"))
    quality = load("quality")
    out.append("| retrieval quality vs unicode61 / trigram / BM25 library | see `bench/quality.py` "
               f"({'results/quality.json' if quality else 'not run here'}) | | | ≥ best of the three | – |")
    print("\n".join(out))
    if ingest:
        si = ingest["service_inprocess"]
        print()
        print("| indexing (drain the pending queue) | units/s | CJK chars/s |\n|---|---|---|")
        for key, label in (("index_rjieba", "indexer, rjieba"), ("index_jieba", "indexer, jieba"),
                           ("tokenize_rjieba", "tokenizer only, rjieba"), ("tokenize_jieba", "tokenizer only, jieba")):
            v = si.get(key) or {}
            print(f"| {label} | {fmt(v.get('units_per_s'))} | {fmt(v.get('cjk_chars_per_s'))} |")
        rr = ingest.get("replica_refresh") or {}
        if rr:
            print()
            print("| replica refresh (online backup of one day shard) | shard MiB | seconds | MiB/s |\n|---|---|---|---|")
            for size, v in rr.items():
                for sh in v["shards"][:1]:
                    print(f"| {int(size):,} units | {sh['shard_mib']} | {sh['seconds']} | {sh['mib_per_s']} |")


if __name__ == "__main__":
    sys.exit(main())
