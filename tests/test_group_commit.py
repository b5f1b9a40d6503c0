"""Group commit (issue 17): concurrent pushes of a tenant share one transaction per file, each request
is answered only after the commit holding its units, and a crash between that commit and the answers
loses nothing acknowledged."""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import make_unit
from crash_support import Writers, check_files, cid_of, verify
from service.store.sqlite.groupcommit import Group, Job
from service.state import app_state

# group commit is the SQLite backend's (on PostgreSQL a push is its own transaction):
# CONTEXT_TEST_BACKEND=postgresql runs these on SQLite
pytestmark = pytest.mark.sqlite_only

HERE = Path(__file__).parent


def jobs_through(group: Group, n: int, units_each: int = 1) -> list[Job]:
    """n threads submit one job each, all at once; returns the jobs once every thread is back."""
    jobs = [Job([(k, f"u{i}-{k}") for k in range(units_each)], [None] * units_each, time.time()) for i in range(n)]
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(job):
        start.wait()
        try:
            group.submit(job)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return jobs


class Recorder:
    """A group's write: records each group, answers every unit with its group's number; the first
    group waits until every other request has queued behind it."""

    def __init__(self, expect_queued: int, fail_group: int | None = None):
        self.groups: list[list[Job]] = []
        self.expect_queued = expect_queued
        self.fail_group = fail_group
        self.group: Group | None = None

    def __call__(self, jobs: list[Job]) -> None:
        if not self.groups:
            deadline = time.monotonic() + 10
            while len(self.group._queue) < self.expect_queued and time.monotonic() < deadline:
                time.sleep(0.001)
        self.groups.append(jobs)
        if len(self.groups) == self.fail_group:
            raise OSError("disk full")
        for job in jobs:
            for i, _ in job.valid:
                job.results[i] = len(self.groups)


def test_requests_arriving_during_a_write_share_the_next_one():
    rec = Recorder(expect_queued=19)
    group = rec.group = Group(rec, max_units=1000)
    jobs = jobs_through(group, 20)
    assert all(j.done and j.error is None and None not in j.results for j in jobs)
    # the first request writes alone; the 19 that queued meanwhile are written together
    assert [len(g) for g in rec.groups] == [1, 19]
    assert group.groups == 2 and group.jobs == 20
    assert sorted(id(j) for g in rec.groups for j in g) == sorted(id(j) for j in jobs)   # each once


def test_a_group_is_bounded_in_units():
    rec = Recorder(expect_queued=11)
    group = rec.group = Group(rec, max_units=10)
    jobs_through(group, 12, units_each=3)
    sizes = [sum(j.units for j in g) for g in rec.groups]
    assert max(sizes) <= 10 and sum(sizes) == 36
    assert len(rec.groups) >= 4


def test_a_failed_write_fails_its_group_only():
    rec = Recorder(expect_queued=9, fail_group=2)
    group = rec.group = Group(rec, max_units=1000)
    jobs = jobs_through(group, 10)
    failed = [j for j in jobs if j.error is not None]
    assert failed and all(isinstance(j.error, OSError) for j in failed)
    assert {id(j) for j in failed} == {id(j) for j in rec.groups[1]}
    assert all(None not in j.results for j in jobs if j.error is None)


def test_concurrent_pushes_through_the_store(make_app):
    """40 threads push singles and batches at once, many of them the same units: every unit is stored
    once with one seq, one request per unit says "ok" and the others "duplicate", all readable."""
    app = make_app()
    store = app_state(app).store
    units = [make_unit(f"group commit unit {i} 组提交", timestamp=int(time.time()) - (i % 3) * 86_400)
             for i in range(60)]
    requests_ = [units[i % 60: i % 60 + (1 if i % 3 else 4)] for i in range(120)]
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda batch: store.push_many("default", batch), requests_))
    statuses: dict[str, Counter] = {}
    seqs: dict[str, set] = {}
    for batch, results in zip(requests_, answers):
        for u, r in zip(batch, results):
            assert isinstance(r, dict) and r["status"] in ("ok", "duplicate"), r
            statuses.setdefault(r["cid"], Counter())[r["status"]] += 1
            seqs.setdefault(r["cid"], set()).add(r["seq"])
            assert store.get("default", r["cid"])["content"] == u["content"]
    assert len(statuses) == 60
    assert all(c["ok"] == 1 for c in statuses.values()), statuses
    assert all(len(s) == 1 for s in seqs.values())
    assert len({next(iter(s)) for s in seqs.values()}) == 60          # one seq per unit
    group = store._groups["default"]
    assert group.jobs == 120 and group.groups <= 120


def test_sigkill_between_a_group_commit_and_its_answers(live_server_factory, tmp_path):
    """The service dies right after committing a group of several requests, before answering any of
    them: none of those requests was acknowledged, yet their units are all stored (durable at commit),
    re-pushing them says "duplicate" (never 409), and every unit acknowledged before is intact."""
    data = tmp_path / "data"
    marker = tmp_path / "crash.json"
    server = live_server_factory(data_dir=data, conf=HERE / "gunicorn_crash_after_group.py",
                                 env={"CRASH_MARKER": str(marker)})
    w = Writers(server.url, "g", seed=7).start()
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    w.join()
    assert marker.exists(), "no group of two or more requests formed under 20 writers"
    server.proc.wait(timeout=10)
    crashed = json.loads(marker.read_text())
    assert crashed["requests"] >= 2
    group_cids = set(crashed["cids"])
    assert not group_cids & w.acked, "a request of the crashed group was answered before the crash"
    again = live_server_factory(data_dir=data)
    s = requests.Session()
    for cid in group_cids:           # committed, never acknowledged: stored whole
        rv = s.get(f"{again.url}/mcp/units/{cid}", timeout=10)
        assert rv.status_code == 200, (cid, rv.text)
    sent = {c: u for c, u in w.sent.items()}
    verify(again.url, sent, w.acked)
    again_units = [sent[c] for c in group_cids if c in sent]
    rv = s.post(f"{again.url}/mcp/push", json=again_units, timeout=30)
    assert rv.status_code == 200
    assert {r["status"] for r in rv.json()["results"]} <= {"duplicate"}, rv.json()
    assert {r["cid"] for r in rv.json()["results"]} == {cid_of(u) for u in again_units}
    again.stop()
    check_files(data, sent)


@pytest.mark.parametrize("writers", [1, 16])
def test_group_commit_answers_match_sequential_pushes(make_app, tmp_path, writers):
    """The same pushes, one at a time and from 16 threads at once: the same statuses per unit, the
    same parent and collision checks (a child whose parent comes in another request of its group)."""
    app = make_app(data_dir=tmp_path / f"d{writers}")
    store = app_state(app).store
    now = int(time.time())
    parent = make_unit("the parent of them all", timestamp=now)
    first = store.push_one("default", parent)
    kids = [make_unit(f"child {i}", timestamp=now, parent_cid=first["cid"]) for i in range(30)]
    orphans = [make_unit(f"orphan {i}", timestamp=now, parent_cid="0123456789ab") for i in range(5)]
    with ThreadPoolExecutor(writers) as pool:
        answers = list(pool.map(lambda u: store.push_many("default", [u])[0], kids + orphans + kids[:5]))
    assert [a["status"] for a in answers[:30]] == ["ok"] * 30
    assert all(getattr(a, "code", None) == "parent_not_found" for a in answers[30:35])
    assert [a["status"] for a in answers[35:]] == ["duplicate"] * 5
    assert [u["cid"] for u in store.lineage("default", answers[0]["cid"])["ancestors"]] == [first["cid"]]
