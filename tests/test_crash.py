"""Crash safety (issue 7): SIGKILL gunicorn (master and workers) mid-stream, restart on the same data.

Each test pushes from 20 writer threads (single units and small batches, several day shards, some
with parents), kills the whole process group at a random moment, restarts and proves:
- every acked unit is readable (GET) with identical fields and searchable once the indexer recovers;
- nothing unacked is half-written: every unit the service returns (GET, search) and every row in
  the shard files is exactly what some writer sent, and pushes that never got their ack can be
  re-pushed (a crashed catalog reservation is repaired, never a 409);
- every .db file passes ``PRAGMA integrity_check`` and every live shard row has its catalog row.
Variants kill during read-index syncs (debounce 0, large shards) and during janitor purges
(short TTLs, janitor interval 0.3 s). The number of acked units checked is printed per test.

On PostgreSQL too (issue 18; the same checks by HTTP, and the tables instead of the files): a service
node SIGKILLed mid-push, and the primary itself stopped with an immediate shutdown (a crash) mid-push
and started again.
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

import pytest
import requests


# The same crash tests on both storage backends (issue 18; tests/conftest.py).
BACKENDS = ("sqlite", "postgresql")

DAY = 86_400
FIELDS = ("type", "source", "timestamp", "ttl", "content", "metadata", "parent_cid")
TYPES = ("user_input", "model_thinking", "tool_output", "system_notice")
CHECKED: dict[str, int] = {}   # test name -> acked units checked, summed by the last test


def cid_of(u: dict) -> str:
    return hashlib.sha256((u["content"] + str(u["timestamp"]) + u["source"]).encode()).hexdigest()[:12]


def expires(u: dict) -> int:
    return u["timestamp"] + u["ttl"]


def same(stored: dict, sent: dict) -> bool:
    return all(stored.get(k) == sent.get(k) for k in FIELDS)


@pytest.fixture
def servers(live_server_factory):
    """Start real gunicorns on given data dirs; all are stopped after the test."""
    return lambda data_dir, **kw: live_server_factory(data_dir=data_dir, **kw)


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


def test_sigkill_mid_stream(servers, tmp_path, backend, store_config):
    data = tmp_path / "data"
    server = servers(data)
    w = Writers(server.url, "a", seed=1).start()
    w.run_until(acked=600, max_s=20)
    time.sleep(random.uniform(0, 0.2))
    server.kill()
    w.join()
    assert len(w.acked) >= 200, "too few pushes acked before the kill to prove anything"
    print(f"\nmid-stream: {len(w.acked)} acked, {len(w.sent) - len(w.acked)} in flight at the kill")
    again = servers(data)
    CHECKED[f"mid_stream[{backend}]"] = verify(again.url, w.sent, w.acked)
    again.stop()
    check_storage(backend, data, store_config.get("store"), w.sent)


@pytest.mark.postgresql_only
def test_primary_crash_mid_push(servers, tmp_path, pg_cluster, store_config):
    """PostgreSQL's primary stopped with an immediate shutdown (no checkpoint: a crash) while 20 writers
    push: the service answers 503 meanwhile, never loses an ack; the primary started again replays its
    WAL, the same service nodes go on, and every unit acked before, during and after is there."""
    data = tmp_path / "data"
    server = servers(data)
    w = Writers(server.url, "p", seed=3, unavailable_ok=True).start()
    w.run_until(acked=400, max_s=20)
    pg_cluster.stop_primary("immediate")
    before = len(w.acked)
    time.sleep(1.0)
    pg_cluster.start_primary()
    w.run_until(acked=before + 300, max_s=30)      # the same node recovers its connections
    w.join()
    assert before >= 200 and len(w.acked) >= before + 100, (before, len(w.acked), w.unavailable, server.log())
    print(f"\nprimary crash: {before} acked before the crash, {len(w.acked)} in all, {w.unavailable} answered 503")
    CHECKED["primary_crash[postgresql]"] = verify(server.url, w.sent, w.acked)
    server.stop()
    check_tables(store_config["store"], w.sent)


@pytest.mark.sqlite_only
def test_sigkill_during_read_index_sync(servers, tmp_path):
    """The leader killed while it sends rows to the read index and commits (debounce 0: a pass every
    poll): after a restart every acked unit is found by a default search, and the index holds each
    indexed unit exactly once (a commit whose flags never flipped is replaced, not duplicated)."""
    data = tmp_path / "data"
    env = {"CONTEXT_REPLICA_DEBOUNCE_MS": "0", "CONTEXT_INDEX_POLL_MS": "20"}
    sent: dict[str, dict] = {}
    acked: set[str] = set()
    rng = random.Random(7)
    server = servers(data, env=env)
    big = Writers(server.url, "s", pad_words=400)
    seed(server.url, [big.unit(99, i, rng, None) for i in range(600)], sent, acked)
    for cycle in range(3):
        if cycle:
            server = servers(data, env=env)
        w = Writers(server.url, f"r{'abc'[cycle]}", pad_words=60, seed=10 + cycle).start()
        w.run_until(acked=200, max_s=rng.uniform(0.5, 1.5))
        server.kill()
        w.join()
        sent.update(w.sent)
        acked |= w.acked
    print(f"\nread index sync: {len(acked)} acked over 3 kills")
    again = servers(data, env=env)
    CHECKED["read_index_sync[sqlite]"] = verify(again.url, sent, acked, replicas=True)
    again.stop()
    check_files(data, sent)
    check_read_index(data)


def check_read_index(data_dir: Path) -> None:
    """With the server stopped: the read index holds exactly the indexed, non-empty rows, once each."""
    import tantivy
    from service.readindex import day_key
    tdir = data_dir / "tenants" / "default"
    want = set()
    for f in sorted((tdir / "primary").glob("*.db")):
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        states = dict(conn.execute("SELECT indexed, count(*) FROM units GROUP BY indexed").fetchall())
        assert set(states) <= {2}, f"{f.name}: rows not in the read index after recovery: {states}"
        want |= {day_key(f.name[:10], rid) for (rid,) in conn.execute("SELECT id FROM units WHERE ntok > 0")}
        conn.close()
    index = tantivy.Index.open(str(tdir / "replica" / "index"))
    searcher = index.searcher()
    hits = searcher.search(tantivy.Query.all_query(), max(1, searcher.num_docs), count=False).hits
    keys = searcher.fast_field_values("key", [a for _, a in hits])
    assert len(keys) == len(set(keys)), "a unit is in the read index twice"
    assert set(keys) == want


def test_sigkill_during_janitor_purge(servers, tmp_path, backend, store_config):
    data = tmp_path / "data"
    env = {"CONTEXT_JANITOR_INTERVAL_S": "0.3", "CONTEXT_INDEX_POLL_MS": "50"}
    sent: dict[str, dict] = {}
    acked: set[str] = set()
    rng = random.Random(11)
    server = servers(data, env=env)
    cycles = 2 if backend == "sqlite" else 1      # (PostgreSQL: one kill, to keep CI's time; issue 18)
    for cycle in range(cycles):
        if cycle:
            server = servers(data, env=env)
        # Many short-lived units (1-5 s) so every janitor pass purges hundreds; day -3 holds only those.
        w = Writers(server.url, f"j{'ab'[cycle]}", short_share=0.5, short_only_day=3, seed=20 + cycle)
        seed(server.url, [w.unit(98, 100_000 * (cycle + 1) + i, rng, None) for i in range(600)], sent, acked)
        w.start()
        w.run_until(acked=10**9, max_s=rng.uniform(2.0, 3.5))
        server.kill()
        w.join()
        sent.update(w.sent)
        acked |= w.acked
    short = sum(1 for c in acked if sent[c]["metadata"]["short"])
    print(f"\njanitor purge: {len(acked)} acked over {cycles} kills ({short} short-lived)")
    again = servers(data, env=env)
    CHECKED[f"janitor_purge[{backend}]"] = verify(again.url, sent, acked)
    time.sleep(1.0)   # a few janitor passes after recovery
    again.stop()
    stats = check_storage(backend, data, store_config.get("store"), sent)
    assert stats["live_rows"] > 0


def test_total_acked_units_checked():
    if len(CHECKED) < 3:
        pytest.skip("runs after the three crash tests")
    total = sum(CHECKED.values())
    print(f"\nacked units checked after SIGKILL: {CHECKED} total {total}")
    assert total > 1000


def test_acked_unit_readable_in_every_worker_after_the_janitor_recreated_its_day(tmp_path):
    """Two workers (two Stores on one data dir). Worker B has read day D; worker A's janitor unlinks D
    once all of it expired, then A stores a new unit for D and acks it. B must read it: SQLite keeps
    reading an unlinked file through already-open connections, so B's pooled readers must reopen."""
    from service.config import Config
    from service.janitor import Janitor
    from service.store import Store
    from service.units import day_of

    config = Config(data_dir=str(tmp_path / "data"), background=False)
    a, b = Store(config), Store(config)
    try:
        ts = int(time.time()) - 5 * DAY
        # (a few seconds of life: B must read it before it expires, on a loaded machine too)
        old = a.push_one("default", {"type": "tool_output", "source": "janitor_v1", "timestamp": ts,
                                     "ttl": int(time.time()) - ts + 4, "content": "expires in a few seconds"})
        assert b.get("default", old["cid"]) is not None        # B now holds open readers on day D
        deadline = time.time() + 30
        while a.get("default", old["cid"]) is not None and time.time() < deadline:
            time.sleep(0.2)                                     # until expired: the janitor may unlink D
        Janitor().run(a.tenant("default"))
        assert not a.tenant("default").primary_path(day_of(ts)).exists(), "the janitor unlinked day D"
        new = a.push_one("default", {"type": "tool_output", "source": "janitor_v1", "timestamp": ts,
                                     "ttl": 10 * DAY, "content": "acked after day D was re-created"})
        assert a.get("default", new["cid"]) is not None
        assert b.get("default", new["cid"]) is not None, "acked unit invisible to a worker with stale readers"
    finally:
        a.close()
        b.close()


def test_old_per_day_replicas_are_removed(tmp_path):
    """Per-day replica copies (and copies a killed refresh left) of versions before the read index."""
    from service.config import Config
    from service.maintenance import Maintenance
    from service.store import Store

    store = Store(Config(data_dir=str(tmp_path / "data"), background=False, replica_debounce_ms=0))
    maintenance = Maintenance(store)
    try:
        ts = int(time.time())
        store.push_one("default", {"type": "tool_output", "source": "replica_v1", "timestamp": ts, "ttl": DAY,
                                   "content": "a unit to refresh"})
        t = store.tenant("default")
        day = t.primary_days()[0]
        old = [t.dir / "replica" / f"{day}.db", t.dir / "replica" / f"{day}.db.tmp-424242-1"]
        for path in old:
            path.write_bytes(b"x" * 4096)
        maintenance.run_once(force_janitor=True)   # the new leader indexes, syncs and runs the janitor
        assert not any(path.exists() for path in old), "old replica files never removed"
        assert (t.dir / "replica" / "index" / "meta.json").exists()
    finally:
        maintenance.stop()
        store.close()
