"""Crash-test helpers (imported by tests/test_crash.py and tests/test_group_commit.py; no tests here,
hence no ``test_`` prefix): 20 writer threads that record what they sent and what was acknowledged, and
the checks after a restart: every acked unit readable and searchable, nothing half-written, unacked
pushes re-pushable, and the storage itself intact (SQLite's files, PostgreSQL's tables).
"""
from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

DAY = 86_400
FIELDS = ("type", "source", "timestamp", "ttl", "content", "metadata", "parent_cid")
TYPES = ("user_input", "model_thinking", "tool_output", "system_notice")


def cid_of(u: dict) -> str:
    return hashlib.sha256((u["content"] + str(u["timestamp"]) + u["source"]).encode()).hexdigest()[:12]


def expires(u: dict) -> int:
    return u["timestamp"] + u["ttl"]


def same(stored: dict, sent: dict) -> bool:
    return all(stored.get(k) == sent.get(k) for k in FIELDS)


class Writers:
    """20 threads pushing singles and small batches until the server dies; records sent and acked units."""

    def __init__(self, url: str, tag: str, *, days: int = 3, pad_words: int = 8, short_share: float = 0.0,
                 short_only_day: int | None = None, writers: int = 20, seed: int = 0, unavailable_ok: bool = False):
        self.url, self.tag, self.days, self.pad_words = url, tag, days, pad_words
        self.unavailable_ok = unavailable_ok      # 503 while the storage is down: not acked, try again
        self.unavailable = 0
        self.short_share, self.short_only_day = short_share, short_only_day
        self.sent: dict[str, dict] = {}
        self.acked: set[str] = set()
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w, random.Random(seed * 100 + w)), daemon=True)
                        for w in range(writers)]

    def unit(self, w: int, i: int, rng: random.Random, parent: str | None) -> dict:
        now = int(time.time())
        d = rng.randrange(self.days + (1 if self.short_only_day else 0))
        short = d == self.days or rng.random() < self.short_share
        if d == self.days:
            d = self.short_only_day           # a day holding only short-lived units: the janitor unlinks it
        ts = now - d * DAY
        # Short-lived units expire 2-6 s after the push, while the janitor is running.
        ttl = d * DAY + rng.randint(2, 6) if short else 10 * DAY
        token = f"zc{self.tag}{w:02d}x{i:05d}"
        u = {"type": TYPES[i % 4], "source": f"crash_{self.tag}_w{w}", "timestamp": ts, "ttl": ttl,
             "content": f"crash unit {token} writer {w} 崩溃 恢复 {i} " + " ".join(
                 rng.choice(("alpha", "beta", "订单", "gamma", "发货", "delta", "ORD-7890")) for _ in range(self.pad_words)),
             "metadata": {"w": w, "i": i, "token": token, "short": short}}
        if parent and not short:
            u["parent_cid"] = parent
        return u

    def _run(self, w: int, rng: random.Random) -> None:
        sess, i, parents = requests.Session(), 0, []
        while not self.stop.is_set():
            n = 1 if rng.random() < 0.6 else rng.randint(2, 5)
            batch = []
            for _ in range(n):
                i += 1
                parent = rng.choice(parents) if parents and rng.random() < 0.3 else None
                batch.append(self.unit(w, i, rng, parent))
            with self.lock:
                for u in batch:
                    self.sent[cid_of(u)] = u
            try:
                rv = sess.post(self.url + "/mcp/push", json=batch if n > 1 else batch[0], timeout=30)
            except requests.RequestException:
                return      # the server was killed: these units were sent but never acked
            if rv.status_code == 422 and rv.json().get("code") == "already_expired":
                continue
            if rv.status_code == 503 and self.unavailable_ok:
                self.unavailable += 1
                time.sleep(0.05)
                continue
            if rv.status_code != 200:
                self.errors.append(f"{rv.status_code} {rv.text[:200]}")
                continue
            results = rv.json()["results"] if n > 1 else [rv.json()]
            for u, r in zip(batch, results):
                if r.get("code") == "already_expired" and u["metadata"]["short"]:
                    continue        # a slow push of a 2 s unit: rejected, never stored
                if r.get("status") not in ("ok", "duplicate") or r.get("cid") != cid_of(u):
                    self.errors.append(json.dumps(r)[:200])
                    continue
                with self.lock:
                    self.acked.add(r["cid"])
                if not u["metadata"]["short"]:
                    parents.append(r["cid"])

    def start(self) -> "Writers":
        for t in self.threads:
            t.start()
        return self

    def run_until(self, acked: int, max_s: float) -> None:
        deadline = time.monotonic() + max_s
        while len(self.acked) < acked and time.monotonic() < deadline:
            time.sleep(0.02)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors[:5]


def seed(url: str, units: list[dict], sent: dict, acked: set) -> None:
    """Push big batches before the crash loop (acked units like any other)."""
    s = requests.Session()
    for k in range(0, len(units), 500):
        batch = units[k:k + 500]
        for u in batch:
            sent[cid_of(u)] = u
        rv = s.post(url + "/mcp/push", json=batch, timeout=120)
        assert rv.status_code == 200, rv.text
        for u, r in zip(batch, rv.json()["results"]):
            if r.get("code") == "already_expired" and u["metadata"]["short"]:
                continue
            assert r["status"] in ("ok", "duplicate") and r["cid"] == cid_of(u), r
            acked.add(r["cid"])


def get_all(url: str, cids) -> dict[str, dict | None]:
    local = threading.local()

    def one(cid):
        if not hasattr(local, "s"):
            local.s = requests.Session()
        rv = local.s.get(f"{url}/mcp/units/{cid}", timeout=30)
        assert rv.status_code in (200, 404), rv.text
        return cid, rv.json() if rv.status_code == 200 else None

    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, list(cids)))


def ready(url: str, *, replicas: bool = False, timeout: float = 60) -> dict:
    """Wait until the indexer (and, if asked, the replica refresher) has caught up after the restart."""
    deadline = time.monotonic() + timeout
    while True:
        body = requests.get(url + "/readyz", timeout=30).json()
        if body["index_pending"] == 0 and (not replicas or body["replica_lag_ms"] == 0):
            return body
        assert time.monotonic() < deadline, f"indexer did not recover: {body}"
        time.sleep(0.2)


def verify(url: str, sent: dict, acked: set, *, replicas: bool = False) -> int:
    """GET, re-push and search checks after a restart; returns how many acked units were checked."""
    start = time.time()
    # Units that cannot expire during the checks must all be there; short-lived ones may be gone.
    must = {c for c in acked if expires(sent[c]) > start + 60}
    checked = len(must)
    # Every unit that must be there or was never acked; a sample of the short-lived acked ones.
    short = sorted(c for c in acked if c not in must)
    got = get_all(url, [c for c in sent if c in must or c not in acked] +
                  random.Random(3).sample(short, min(300, len(short))))
    for cid, stored in got.items():
        if stored is None:
            assert cid not in must, f"acked unit {cid} lost in the crash"
            continue
        assert same(stored, sent[cid]), f"unit {cid} differs from what was sent: {stored} vs {sent[cid]}"
        assert expires(sent[cid]) > start - 2, f"expired unit {cid} still readable"
    unacked_present = sum(1 for c, v in got.items() if v is not None and c not in acked)

    # Pushes that never got their ack can be pushed again (a crashed reservation is repaired, not a 409).
    retry = [sent[c] for c in sent if c not in acked and expires(sent[c]) > time.time() + 30]
    s = requests.Session()
    for k in range(0, len(retry), 200):
        rv = s.post(url + "/mcp/push", json=retry[k:k + 200], timeout=60)
        assert rv.status_code == 200, rv.text
        for u, r in zip(retry[k:k + 200], rv.json()["results"]):
            assert r["status"] in ("ok", "duplicate") and r["cid"] == cid_of(u), r
            must.add(r["cid"])
    for cid, stored in get_all(url, [cid_of(u) for u in retry]).items():
        assert stored is not None and same(stored, sent[cid]), cid

    # Searchable once the indexer has recovered: 50 unique tokens per query.
    t_ready = time.time()
    ready(url, replicas=replicas)
    t_search = time.time()
    consistency = "replica" if replicas else "strong"
    by_token = {sent[c]["metadata"]["token"]: c for c in must}
    tokens = sorted(by_token)
    for k in range(0, len(tokens), 50):
        chunk = tokens[k:k + 50]
        want = {by_token[t] for t in chunk}
        deadline = time.monotonic() + 20
        while True:
            rv = s.post(url + "/mcp/search", json={"query": " ".join(chunk), "top_k": 100,
                                                   "consistency": consistency}, timeout=60)
            assert rv.status_code == 200, rv.text
            results = rv.json()["results"]
            for r in results:
                assert r["cid"] in sent and same(r, sent[r["cid"]]), f"search returned a unit nobody sent: {r}"
            missing = want - {r["cid"] for r in results}
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.3)  # replica mode: a refresh may still be on its way
        assert not missing, f"acked units not searchable after the crash: {sorted(missing)[:5]}"
    print(f"  checked {checked} acked units (GET + search); {unacked_present} unacked-but-complete units "
          f"present; {len(retry)} unacked units re-pushed and found (reads {t_ready - start:.1f} s, "
          f"recovery {t_search - t_ready:.1f} s, searches {time.time() - t_search:.1f} s)")
    return checked


def check_files(data_dir: Path, sent: dict) -> dict:
    """With the server stopped: integrity of every .db file; live shard rows have catalog rows and were sent."""
    tdir = data_dir / "tenants" / "default"
    files = [tdir / "catalog.db", *sorted((tdir / "primary").glob("*.db")), *sorted((tdir / "replica").glob("*.db"))]
    for f in files:
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], f
        conn.close()
    now = int(time.time())
    conn = sqlite3.connect(f"file:{tdir / 'catalog.db'}?mode=ro", uri=True)
    catalog = {r[0]: r[1] for r in conn.execute("SELECT cid, day FROM catalog")}
    days = {r[0] for r in conn.execute("SELECT day FROM days")}
    conn.close()
    rows = expired_left = 0
    for f in sorted((tdir / "primary").glob("*.db")):
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        for r in conn.execute("SELECT cid, type, source, timestamp, ttl, content, metadata, parent_cid, "
                              "expires_at FROM units"):
            unit = {**dict(r), "metadata": json.loads(r["metadata"]) if r["metadata"] else None}
            assert r["cid"] in sent and same(unit, sent[r["cid"]]), f"half-written or foreign row {r['cid']} in {f}"
            if r["expires_at"] > now:
                # Push writes the catalog first, janitor and delete remove it last: a live row always has one.
                assert catalog.get(r["cid"]) == f.stem, f"live shard row {r['cid']} has no catalog row"
                rows += 1
            else:
                expired_left += 1
        conn.close()
    leftovers = sorted(p.name for p in (tdir / "replica").glob("*.tmp-*"))
    orphan_days = sorted(f.stem for f in (tdir / "primary").glob("*.db") if f.stem not in days)
    print(f"  {len(files)} .db files integrity ok; {rows} live shard rows all in the catalog; "
          f"{expired_left} expired rows not yet purged; replica temp files left by kills: {len(leftovers)}; "
          f"day files without a days row: {orphan_days}")
    # The restarted leader's janitor removes copies cut short by the kills (a full shard each).
    assert not leftovers, leftovers
    return {"files": len(files), "live_rows": rows, "expired_left": expired_left, "leftovers": leftovers}


def check_tables(store_url: str, sent: dict) -> dict:
    """PostgreSQL's counterpart of check_files: every unit row is exactly what some writer sent, live
    units and catalog rows match one to one, nothing is left queued, the BM25 statistics are exact."""
    import psycopg
    now = int(time.time())
    with psycopg.connect(store_url) as c:
        rows = c.execute("SELECT cid, type, source, timestamp, ttl, content, metadata, parent_cid, expires_at "
                         "FROM units").fetchall()
        for cid, type_, source, ts, ttl, content, metadata, parent, _ in rows:
            unit = {"type": type_, "source": source, "timestamp": ts, "ttl": ttl, "content": content,
                    "metadata": json.loads(metadata) if metadata else None, "parent_cid": parent}
            assert cid in sent and same(unit, sent[cid]), f"half-written or foreign row {cid}"
        live = {r[0] for r in rows if r[8] > now}
        catalog = {r[0] for r in c.execute("SELECT cid FROM catalog WHERE expires_at > %s", (now,))}
        assert live == catalog, (len(live - catalog), len(catalog - live))
        assert c.execute("SELECT count(*) FROM pending").fetchone()[0] == 0
        searchable = {r[0] for r in c.execute("SELECT cid FROM unit_terms WHERE expires_at > %s", (now,))}
        assert searchable == live, (len(live - searchable), len(searchable - live))
        stats = c.execute("SELECT coalesce(sum(ndocs), 0), coalesce(sum(ntokens), 0) FROM day_stats").fetchone()
        assert stats == c.execute("SELECT count(*), coalesce(sum(ntok), 0) FROM unit_terms").fetchone()
    print(f"  {len(live)} live unit rows, all in the catalog and indexed; statistics exact")
    return {"live_rows": len(live)}


def check_storage(backend: str, data: Path, store_url: str | None, sent: dict) -> dict:
    return check_files(data, sent) if backend == "sqlite" else check_tables(store_url, sent)
