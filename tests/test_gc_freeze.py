"""Full garbage collections do not walk what a process holds from its start (service/boot.py freeze_heap):
gunicorn's master before it forks the workers, each worker once its app is loaded, and the maintainer.
A full collection holds the GIL, so it stops every thread of a worker; over the start-up heap it took
179 ms at p50 under load (bench/README.md, "Full collections")."""
import gc
import json
import time
import weakref
from pathlib import Path

import requests

from service.boot import freeze_heap

HERE = Path(__file__).parent


class Node:
    pass


def test_freeze_heap_takes_what_exists_out_of_collections_and_leaves_new_objects_collectable():
    before = gc.get_freeze_count()
    held = {"an": ["object", "made", "before"]}
    garbage = Node()
    garbage.self = garbage                  # a cycle start-up left behind: freed, not frozen for good
    gone = weakref.ref(garbage)
    del garbage
    try:
        freeze_heap()
        assert gone() is None
        assert gc.get_freeze_count() > before
        walked = {id(o) for o in gc.get_objects()}
        assert id(held) not in walked and id(held["an"]) not in walked
        later = [held]
        assert id(later) in {id(o) for o in gc.get_objects()}      # made after: collected as usual
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1                                    # new garbage is still freed
    finally:
        gc.unfreeze()                       # the rest of the suite's objects back to normal collection


def test_master_workers_and_maintainer_run_with_their_start_up_heap_frozen(tmp_path, live_server_factory):
    report = tmp_path / "freeze.jsonl"
    server = live_server_factory(conf=HERE / "gunicorn_freeze_report.py", env={"FREEZE_REPORT": str(report)})
    # the service works as before: a push is found by a strong search
    r = requests.post(server.url + "/mcp/push", json={"type": "user_input", "source": "gc-test", "ttl": 3600,
                                                      "content": "frozen heaps still answer 冻结"}, timeout=10)
    assert r.status_code == 200, r.text
    hits = requests.get(server.url + "/mcp/search", params={"q": "冻结", "consistency": "strong"}, timeout=10)
    assert [u["content"] for u in hits.json()["results"]] == ["frozen heaps still answer 冻结"]
    deadline = time.monotonic() + 30
    while True:
        lines = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
        roles = [x["role"] for x in lines]
        if roles.count("worker") >= 2 and "maintainer" in roles or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    by_role = {}
    for x in lines:
        by_role.setdefault(x["role"], []).append(x)
    # the master froze its modules and the segmenter as the service's settings loaded, before forking
    assert len(by_role.get("master", [])) == 1 and by_role["master"][0]["frozen"] > 10_000, lines
    assert len(by_role.get("worker", [])) == 2, lines
    for w in by_role["worker"]:
        assert w["frozen"] > 10_000, w                     # modules, the segmenter, the app
        assert not w["app_walked"] and not w["store_walked"], w
    assert by_role.get("maintainer") and by_role["maintainer"][0]["frozen"] > 10_000, lines
    assert len({x["pid"] for x in lines}) == len(lines)   # each from its own process
