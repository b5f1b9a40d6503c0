"""Ingest, indexing, freshness and read-index cost (docs/design.md §10).

1. batch ingest to durable storage, in-process (push_many, batches of 1000) and over HTTP
   (POST /mcp/push {"units": [1000]} to gunicorn), service vs baseline (which indexes inline);
2. indexing rate (units/s, CJK chars/s) draining the pending queue, rjieba vs jieba, plus the
   bare segmentation rate of each;
3. index lag under a sustained push load against gunicorn: a probe unit with a unique token is
   pushed every 0.5 s and searched for (default consistency: the read index) every 20 ms; lag =
   first hit - push ack;
4. read-index cost: sending the units of a burst, and a steady-state pass (idle, and with 1,000
   new units) per corpus size.

    python bench/ingest.py                                  # full
    python bench/ingest.py --units 20000 --duration 10 --sizes 20000
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import threading
import time
import uuid

from common import (TMP, app_parts, machine, plt, quiet_service_logs, r, save_plot, service_rev, service_src,
                    summary, write_json)

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def fresh(name: str):
    d = TMP / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def gen_units(n: int, seed: int) -> list[dict]:
    from corpus import Generator
    return list(Generator(seed).units(n))


# --- 1 and 2: in-process ----------------------------------------------------------------------
def inprocess(units: list[dict], segmenter: str, jieba_units: int) -> dict:
    from service import create_app
    out = {}
    d = fresh("ingest-service")
    app = create_app({"data_dir": str(d), "background": False, "segmenter": segmenter})
    store, maint = app_parts(app).store, app_parts(app).maintenance
    t0 = time.perf_counter()
    for i in range(0, len(units), 1000):
        for res in store.push_many("default", units[i:i + 1000]):
            assert isinstance(res, dict), res
    push_s = time.perf_counter() - t0
    out["push_units_per_s"] = round(len(units) / push_s)
    chars = sum(len(u["content"]) for u in units)
    cjk = sum(len(_HAN.findall(u["content"])) for u in units)
    t0 = time.perf_counter()
    n = drain_index(store, maint)
    idx_s = time.perf_counter() - t0
    out[f"index_{segmenter}"] = {"units": n, "seconds": r(idx_s), "units_per_s": round(n / idx_s),
                                 "cjk_chars_per_s": round(cjk / idx_s), "chars_per_s": round(chars / idx_s)}
    # The read index after the burst: every indexed unit sent and committed in one pass.
    t0 = time.perf_counter()
    sent = maint.sync_read_index(maint.read_sync("default"))
    secs = time.perf_counter() - t0
    out["read_index_after_burst"] = {"units": sent, "seconds": r(secs, 3), "units_per_s": round(sent / secs)}
    app_parts(app).shutdown()
    # Segmentation alone: what the tokenizer costs with each segmenter.
    from service.tokenize import Tokenizer
    for seg in ("rjieba", "jieba"):
        tok = Tokenizer(segmenter=seg)
        sample = units[:jieba_units] if seg == "jieba" else units
        sc = sum(len(_HAN.findall(u["content"])) for u in sample)
        t0 = time.perf_counter()
        for u in sample:
            tok.tokens(u["content"])
        s = time.perf_counter() - t0
        out[f"tokenize_{seg}"] = {"units": len(sample), "units_per_s": round(len(sample) / s),
                                  "cjk_chars_per_s": round(sc / s)}
    # Indexing with pure-Python jieba on a smaller sample (it is much slower).
    d = fresh("ingest-service-jieba")
    app = create_app({"data_dir": str(d), "background": False, "segmenter": "jieba"})
    store, maint = app_parts(app).store, app_parts(app).maintenance
    sample = units[:jieba_units]
    for i in range(0, len(sample), 1000):
        store.push_many("default", sample[i:i + 1000])
    sc = sum(len(_HAN.findall(u["content"])) for u in sample)
    t0 = time.perf_counter()
    n = drain_index(store, maint)
    s = time.perf_counter() - t0
    out["index_jieba"] = {"units": n, "seconds": r(s), "units_per_s": round(n / s), "cjk_chars_per_s": round(sc / s)}
    app_parts(app).shutdown()
    shutil.rmtree(TMP / "ingest-service")
    shutil.rmtree(d)
    return out


def baseline_inprocess(units: list[dict]) -> dict:
    from baseline.app import BaselineStore
    d = fresh("ingest-baseline")
    b = BaselineStore(d / "b.db")
    t0 = time.perf_counter()
    for i in range(0, len(units), 1000):
        b.push_many(units[i:i + 1000])
    s = time.perf_counter() - t0
    b.close()
    shutil.rmtree(d)
    return {"push_units_per_s": round(len(units) / s), "note": "durable and indexed in the same transaction"}


# --- HTTP helpers -----------------------------------------------------------------------------
class Client:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: bytes) -> tuple[int, dict]:
        for attempt in (0, 1):
            try:
                self.conn.request("POST", path, body, {"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                return resp.status, json.loads(resp.read())
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError


def http_batch_ingest(port: int, units: list[dict], clients: int = 2) -> dict:
    bodies = [json.dumps({"units": units[i:i + 1000]}, ensure_ascii=False).encode()
              for i in range(0, len(units), 1000)]
    lat, errors = [], [0]
    lock = threading.Lock()
    it = iter(bodies)

    def worker():
        c = Client(port)
        while True:
            with lock:
                body = next(it, None)
            if body is None:
                return
            t0 = time.perf_counter()
            status, data = c.post("/mcp/push", body)
            lat.append((time.perf_counter() - t0) * 1000)
            if status != 200 or any(x.get("status") == "error" for x in data.get("results", [])):
                errors[0] += 1
    t0 = time.perf_counter()
    ths = [threading.Thread(target=worker) for _ in range(clients)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    s = time.perf_counter() - t0
    return {"units": len(units), "batch": 1000, "clients": clients, "units_per_s": round(len(units) / s),
            "batch_latency": summary(lat), "errors": errors[0]}


def push_load(port: int, load_units: list[dict], rate: float, tag: str = "L") -> tuple[threading.Event, list, list]:
    """Start a sustained push load at ``rate`` units/s (batches of 50, 2 threads); returns (stop event,
    [units pushed so far], threads). Each unit's content gets a unique suffix, so none is a duplicate."""
    stop = threading.Event()
    pushed = [0]
    now = int(time.time()) - 30

    def loader(offset: int):
        c = Client(port)
        i = offset
        period = 50 / (rate / 2)
        nxt = time.perf_counter()
        while not stop.is_set():
            batch = []
            for _ in range(50):
                u = dict(load_units[i % len(load_units)])
                u.pop("cid", None), u.pop("parent_cid", None)
                u["timestamp"] = now
                u["content"] = f"{u['content']} {tag}{offset}x{i}"
                batch.append(u)
                i += 2
            c.post("/mcp/push", json.dumps({"units": batch}, ensure_ascii=False).encode())
            pushed[0] += 50
            nxt += period
            delay = nxt - time.perf_counter()
            if delay > 0:
                stop.wait(delay)
    loaders = [threading.Thread(target=loader, args=(k,), daemon=True) for k in range(2)]
    for th in loaders:
        th.start()
    return stop, pushed, loaders


def index_lag(port: int, load_units: list[dict], rate: float, duration: float, strong_probe: bool = False,
              search_port: int | None = None) -> dict:
    """Sustained push load at ``rate`` units/s (batches of 50, 2 threads) while probing freshness: a probe
    unit pushed to ``port``, then default searches for it (on ``search_port``, another node of the same
    store, when given) until found."""
    t_start = time.perf_counter()
    stop, pushed, loaders = push_load(port, load_units, rate)
    lags, misses = [], 0
    probe_c = Client(port)
    search_c = Client(search_port) if search_port else probe_c
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        token = "probe" + uuid.uuid4().hex[:10]
        unit = {"type": "system_notice", "source": "bench_probe_v1_local", "timestamp": int(time.time()),
                "ttl": 86_400, "content": f"freshness probe {token}"}
        status, _ = probe_c.post("/mcp/push", json.dumps(unit).encode())
        acked = time.perf_counter()
        q = json.dumps({"query": token, "top_k": 1}).encode()
        found = None
        while time.perf_counter() - acked < 30:
            status, data = search_c.post("/mcp/search", q)
            if status == 200 and data.get("results"):
                found = time.perf_counter()
                break
            time.sleep(0.02)
        if found is None:
            misses += 1
        else:
            lags.append((found - acked) * 1000)
        time.sleep(max(0.0, 0.5 - (time.perf_counter() - acked)))
    stop.set()
    for th in loaders:
        th.join(timeout=30)
    elapsed = time.perf_counter() - t_start
    return {"target_rate_units_per_s": rate, "achieved_units_per_s": round(pushed[0] / elapsed),
            "probes": len(lags) + misses, "misses_after_30s": misses, "lag": summary(lags), "raw_ms": [round(x, 1) for x in lags]}


def read_index_cost(size: int, seed: int, batch: int = 1000, rounds: int = 5) -> dict:
    """A read-index pass in steady state on a copy of the corpus: an idle pass, and a pass that sends
    ``batch`` new units (pushed and indexed into FTS5 first), timed separately."""
    import shutil
    from corpus import TMP, Generator, service_dir
    from service import create_app
    run_dir = TMP / "run-read-index"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(service_dir(size, seed), run_dir)
    app = create_app({"data_dir": str(run_dir), "background": False, "replica_debounce_ms": 0})
    store, maint = app_parts(app).store, app_parts(app).maintenance
    t = store.tenant("default")
    writer = maint.read_sync(t.name)
    maint.sync_read_index(writer)
    idle, sends, sent_units = [], [], []
    now = int(time.time()) - 60
    units = list(Generator(seed + 991).units(batch * rounds))
    for k in range(rounds):
        t0 = time.perf_counter()
        maint.sync_read_index(writer)
        idle.append(time.perf_counter() - t0)
        part = units[k * batch:(k + 1) * batch]
        for u in part:
            u.pop("cid"), u.pop("parent_cid", None)
            u["timestamp"] = now
        store.push_many("default", part)
        drain_index(store, maint)
        t0 = time.perf_counter()
        sent_units.append(maint.sync_read_index(writer))   # a generated duplicate is stored once
        sends.append(time.perf_counter() - t0)
    app_parts(app).shutdown()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"idle_pass_ms": summary([x * 1000 for x in idle]), "units_per_pass": batch,
            "pass_with_units_ms": summary([x * 1000 for x in sends]),
            "units_per_s_in_passes": r(sum(sent_units) / sum(sends), 0)}


def drain_index(store, maint) -> int:
    """Index every pending unit of the default tenant; return how many."""
    n = 0
    while k := maint.index_tenant(store.tenant("default")):
        n += k
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=100_000, help="units for the ingest/indexing rates")
    ap.add_argument("--jieba-units", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=30, help="index-lag run, seconds")
    ap.add_argument("--rate", type=float, default=1000, help="sustained push load, units/s")
    ap.add_argument("--sizes", default="100000,1000000", help="corpus sizes for the read-index pass cost")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--name", default="ingest")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    quiet_service_logs()
    import http_bench as hb
    free_port, start_baseline, start_service, stop, wait_ready = (
        hb.free_port, hb.start_baseline, hb.start_service, hb.stop, hb.wait_ready)

    units = gen_units(a.units, a.seed + 500)   # a stream of their own: not the search corpus
    out = {"machine": machine(), "service_rev": service_rev(src), "units": a.units}
    print("== in-process ingest and indexing")
    out["service_inprocess"] = inprocess(units, "rjieba", a.jieba_units)
    print("  service ", json.dumps(out["service_inprocess"]))
    if not a.no_baseline:
        out["baseline_inprocess"] = baseline_inprocess(units)
        print("  baseline", json.dumps(out["baseline_inprocess"]))

    print("== HTTP batch ingest and index lag")
    d = fresh("ingest-http-service")
    port = free_port()
    proc = start_service(src, d, port)
    try:
        wait_ready(port, 120)
        out["service_http_batch"] = http_batch_ingest(port, units[: min(len(units), 50_000)])
        print("  service  batch", json.dumps(out["service_http_batch"]))
        time.sleep(2)
        _drain(port)
        out["service_index_lag"] = index_lag(port, units, a.rate, a.duration)
        print("  service  lag", json.dumps({k: v for k, v in out["service_index_lag"].items() if k != "raw_ms"}))
        out["service_readyz_after"] = _get(port, "/readyz")
    finally:
        stop(proc)
    shutil.rmtree(d)
    if not a.no_baseline:
        d = fresh("ingest-http-baseline")
        port = free_port()
        proc = start_baseline(d / "b.db", port)
        try:
            wait_ready(port, 60)
            out["baseline_http_batch"] = http_batch_ingest(port, units[: min(len(units), 50_000)])
            print("  baseline batch", json.dumps(out["baseline_http_batch"]))
            out["baseline_index_lag"] = index_lag(port, units, a.rate, a.duration)
            print("  baseline lag", json.dumps({k: v for k, v in out["baseline_index_lag"].items() if k != "raw_ms"}))
        finally:
            stop(proc)
        shutil.rmtree(d)

    print("== read-index pass cost")
    out["read_index_pass"] = {}
    for size in [int(x) for x in a.sizes.split(",")]:
        out["read_index_pass"][str(size)] = read_index_cost(size, a.seed)
        print(f"  {size}", json.dumps(out["read_index_pass"][str(size)]))
    out["targets"] = {"batch_ingest_units_per_s": 10_000, "index_lag_p99_ms": 2000}
    write_json(a.name, out)
    plot(out, a.name)


def _get(port: int, path: str) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    return json.loads(c.getresponse().read())


def _drain(port: int, timeout: float = 300) -> None:
    """Wait until the service's indexer has caught up with the batch-ingest burst."""
    deadline = time.time() + timeout
    while time.time() < deadline and _get(port, "/readyz").get("index_pending"):
        time.sleep(0.5)


def plot(out: dict, name: str) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for system in ("service", "baseline"):
        raw = (out.get(f"{system}_index_lag") or {}).get("raw_ms")
        if raw:
            v = sorted(raw)
            ax.plot(v, [i / len(v) for i in range(1, len(v) + 1)], label=f"{system}")
    ax.axvline(2000, color="grey", lw=0.8, ls=":")
    ax.set_xscale("symlog")
    ax.set_xlabel("push ack -> found by a default search (ms)")
    ax.set_ylabel("fraction of probes")
    ax.set_title(f"index lag under {out.get('service_index_lag', {}).get('target_rate_units_per_s')} units/s push load")
    ax.legend()
    ax = axes[1]
    s = out["service_inprocess"]
    labels = ["durable push\n(service)", "index rjieba", "index jieba", "baseline push\n(+FTS inline)",
              "HTTP batch\n(service)", "HTTP batch\n(baseline)"]
    vals = [s["push_units_per_s"], s["index_rjieba"]["units_per_s"], s["index_jieba"]["units_per_s"],
            (out.get("baseline_inprocess") or {}).get("push_units_per_s", 0),
            out["service_http_batch"]["units_per_s"], (out.get("baseline_http_batch") or {}).get("units_per_s", 0)]
    ax.bar(labels, vals, color=["C0", "C0", "C0", "C1", "C0", "C1"])
    ax.axhline(10_000, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("units/s")
    ax.set_title("ingest and indexing rates")
    ax.tick_params(axis="x", labelsize=8)
    save_plot(fig, name)


if __name__ == "__main__":
    main()
