"""Failover for real (docs/postgresql.md, "Failover"): two service nodes (real gunicorns, each with its own
read index) on a primary with a synchronous standby, both named in a libpq host list. Writers and searchers
run on both nodes; the primary is stopped with an immediate shutdown (a crash) and the standby promoted.
Every acknowledged unit reads back on both nodes, default searches answer throughout (from the nodes' read
indexes and the standby while there is no primary), pushes answer 503 + Retry-After meanwhile, and both
nodes take writes again with no restart."""
from __future__ import annotations

import random
import threading
import time

import pytest
import requests

from conftest import LiveServer, make_unit, pg_cluster_module

pytestmark = pytest.mark.postgresql_only


class Load:
    """Writers and default searchers on every node, until stopped; what each answered."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[str, str] = {}           # cid -> its unique word
        self.push_status: dict[int, int] = {}
        self.search_status: dict[int, int] = {}
        self.search_errors: list[str] = []
        self.missing_retry_after = 0
        self.threads = [threading.Thread(target=self._write, args=(u, i), daemon=True)
                        for i, u in enumerate(urls * 2)]
        self.threads += [threading.Thread(target=self._search, args=(u,), daemon=True) for u in urls * 2]

    def _write(self, url: str, w: int) -> None:
        s, n = requests.Session(), 0
        while not self.stop.is_set():
            word = f"fo{w}x{n}"
            n += 1
            try:
                rv = s.post(url + "/mcp/push", json=make_unit(f"failover unit {word}"), timeout=15)
            except requests.RequestException:
                continue                        # not acked: nothing to check
            with self.lock:
                self.push_status[rv.status_code] = self.push_status.get(rv.status_code, 0) + 1
                if rv.status_code == 200:
                    self.acked[rv.json()["cid"]] = word
                elif rv.status_code == 503 and "Retry-After" not in rv.headers:
                    self.missing_retry_after += 1
            time.sleep(0.01)

    def _search(self, url: str) -> None:
        s, rng = requests.Session(), random.Random(url)
        while not self.stop.is_set():
            try:
                rv = s.post(url + "/mcp/search", json={"query": f"failover fo{rng.randrange(4)}x{rng.randrange(50)}"},
                            timeout=15)
                code = rv.status_code
                if code != 200:
                    self.search_errors.append(rv.text[:200])
            except requests.RequestException as e:
                code = 0
                self.search_errors.append(repr(e)[:200])
            with self.lock:
                self.search_status[code] = self.search_status.get(code, 0) + 1
            time.sleep(0.02)

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def pushes_ok_on_every_node(self, timeout: float) -> bool:
        """Whether a push answers 200 on each node again within ``timeout``."""
        deadline = time.monotonic() + timeout
        pending = set(self.urls)
        while pending and time.monotonic() < deadline:
            for url in list(pending):
                try:
                    if requests.post(url + "/mcp/push", json=make_unit(f"probe {time.time()}"),
                                     timeout=5).status_code == 200:
                        pending.discard(url)
                except requests.RequestException:
                    pass
            time.sleep(0.2)
        return not pending

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def test_two_nodes_survive_a_primary_crash_and_a_promotion(tmp_path):
    tool = pg_cluster_module()
    if tool.pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (.ci/setup.d/postgresql.sh installs it)")
    cluster = tool.Cluster(fsync=False, synchronous=True).start()     # (its own folder: postgres must reach it)
    env = {"CONTEXT_STORE": cluster.hosts_url("read-write"), "CONTEXT_STORE_REPLICA": cluster.hosts_url("prefer-standby"),
           "CONTEXT_REPLICA_DEBOUNCE_MS": "100"}
    nodes = [LiveServer(tmp_path / f"node{i}", env=env) for i in range(2)]
    load = None
    try:
        for node in nodes:
            node.start()
        load = Load([n.url for n in nodes]).start()
        time.sleep(4)
        before = len(load.acked)
        assert before > 50, load.push_status
        cluster.stop_primary("immediate")              # a crash: no checkpoint, connections cut
        time.sleep(4)                                  # no primary at all: searches still answer
        during = dict(load.search_status)
        for node in nodes:      # what needs the primary says so: 503 + Retry-After, never a 500
            strong = requests.post(node.url + "/mcp/search", timeout=30,
                                   json={"query": "failover", "consistency": "strong"})
            assert strong.status_code == 503 and "Retry-After" in strong.headers, strong.text
            ready = requests.get(node.url + "/readyz", timeout=30)
            assert ready.status_code == 503 and "Retry-After" in ready.headers, ready.text
        cluster.promote_standby()
        assert load.pushes_ok_on_every_node(timeout=30), (load.push_status, [n.log() for n in nodes])
        time.sleep(3)
        load.join()
        print(f"\nfailover: {len(load.acked)} acked ({before} before the crash), pushes {load.push_status}, "
              f"searches {load.search_status} (by the promotion {during})")
        assert load.search_status.get(200, 0) > 100 and set(load.search_status) == {200}, load.search_errors[:5]
        assert set(load.push_status) <= {200, 503} and load.push_status.get(503, 0) > 0, load.push_status
        assert load.missing_retry_after == 0
        for node in nodes:                           # every acked unit, on both nodes
            s = requests.Session()
            missing = [cid for cid in load.acked if s.get(f"{node.url}/mcp/units/{cid}", timeout=10).status_code != 200]
            assert missing == [], (len(missing), node.log())
        # and default searches on both find them once the nodes' read indexes have followed the promotion
        sample = random.Random(7).sample(sorted(load.acked), min(60, len(load.acked)))
        for node in nodes:
            deadline = time.monotonic() + 60
            while True:
                found = [cid for cid in sample if cid in {
                    r["cid"] for r in requests.post(node.url + "/mcp/search", timeout=10, json={
                        "query": f"failover {load.acked[cid]}"}).json()["results"]}]
                if len(found) == len(sample) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert len(found) == len(sample), node.log()
    finally:
        if load is not None:
            load.join()
        for node in nodes:
            node.stop()
        cluster.stop()
