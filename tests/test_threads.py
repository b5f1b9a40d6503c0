"""Threads (docs/design.md §3 "Threads", §6 "Threads in ranking"): what a unit's thread is, and how a default
search ranks with the evidence of a unit's thread and of its neighbors, on both stores."""
from __future__ import annotations

import json
import time

import pytest

from conftest import drain, make_unit, replayed
from service.state import app_state

BACKENDS = ("sqlite", "postgresql")
NOW = int(time.time())


def push(client, content, *, headers=None, **kw) -> str:
    kw.setdefault("timestamp", NOW - 3600)
    rv = client.post("/mcp/push", json=make_unit(content, **kw), headers=headers or {})
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()["cid"]


def unit(client, cid, headers=None) -> dict:
    rv = client.get(f"/mcp/units/{cid}", headers=headers or {})
    assert rv.status_code == 200
    return rv.get_json()


def search(client, query, headers=None, **extra) -> list[dict]:
    rv = client.post("/mcp/search", json={"query": query, **extra}, headers=headers or {})
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()["results"]


def session(client, title, turns, *, start, source="chat_v1", **kw) -> tuple[str, list[str]]:
    """A root (its header) and its turns as children, a minute apart: a client that knows its sessions."""
    root = push(client, title, type="system_notice", source=source, timestamp=start, **kw)
    cids = [push(client, text, type="user_input", source=source, timestamp=start + 60 * (i + 1), parent_cid=root,
                 **kw) for i, text in enumerate(turns)]
    return root, cids


def settled(app) -> None:
    drain(app)
    replayed(app)


# --- what a thread is ----------------------------------------------------------------------------------
def test_a_child_joins_its_parents_thread_in_order_and_a_lone_unit_is_its_own(client):
    root, turns = session(client, "session one", ["first turn", "second turn", "third turn"], start=NOW - 7200)
    grandchild = push(client, "a tool's output", parent_cid=turns[1], timestamp=NOW - 7000)
    lone = push(client, "a note of its own", timestamp=NOW - 7000)
    for cid in [root, *turns, grandchild]:
        assert unit(client, cid)["thread"] == root
    assert unit(client, lone)["thread"] == lone
    # the same unit again (a duplicate, even with another parent) keeps its thread
    again = client.post("/mcp/push", json=make_unit("a note of its own", timestamp=NOW - 7000, parent_cid=root))
    assert again.get_json()["status"] == "duplicate"
    assert unit(client, lone)["thread"] == lone


def test_metadata_session_groups_units_across_sources_and_names_the_same_thread_each_time(client):
    a = push(client, "Ann: shall we meet", source="chat_ann", metadata={"session": "s-42"})
    b = push(client, "Bob: at noon", source="chat_bob", metadata={"session": "s-42"}, timestamp=NOW - 3500)
    c = push(client, "Bob: another day", source="chat_bob", metadata={"session": 42}, timestamp=NOW - 3400)
    d = push(client, "Bob: no session", source="chat_bob", metadata={"session": True}, timestamp=NOW - 3300)
    assert unit(client, a)["thread"] == unit(client, b)["thread"] != a
    assert unit(client, c)["thread"] not in (a, unit(client, a)["thread"])    # another session's name
    assert unit(client, d)["thread"] == d                                    # not a name: its own


def test_time_adjacency_joins_a_sources_units_only_when_turned_on(make_app, tmp_path):
    for gap, joined in ((0, False), (1800, True)):
        client = make_app(thread_gap_s=gap, data_dir=tmp_path / f"gap-{gap}").test_client()
        # (units of their own per pass: on PostgreSQL both apps share the test's database, where a duplicate
        # keeps the thread it was first stored with)
        first = push(client, f"note one {gap}", source="cli_v1", timestamp=NOW - 4000)
        later = push(client, f"note two {gap}", source="cli_v1", timestamp=NOW - 3000)      # 1000 s later
        same_second = push(client, f"note three {gap}", source="cli_v1", timestamp=NOW - 4000)
        other = push(client, f"note four {gap}", source="other_v1", timestamp=NOW - 3990)
        far = push(client, f"note five {gap}", source="cli_v1", timestamp=NOW - 3000 + 1801)
        assert (unit(client, later)["thread"] == first) is joined
        assert unit(client, same_second)["thread"] == same_second        # (a bulk import's units stay apart)
        assert unit(client, other)["thread"] == other
        assert unit(client, far)["thread"] == far


# --- ranking with threads ------------------------------------------------------------------------------
def test_a_turn_whose_session_is_about_the_question_outranks_an_equal_turn_elsewhere(app, client):
    _, lake = session(client, "session 1", ["we planned the lake trip for june", "the lake water was cold",
                                            "I bought new hiking boots"], start=NOW - 86_400)
    _, build = session(client, "session 2", ["the compiler failed on the build server", "fixed the linker flags",
                                             "I bought new hiking boots"], start=NOW - 40_000)
    settled(app)
    found = search(client, "hiking boots for the lake", explain=True)
    order = [r["cid"] for r in found]
    # equal own BM25; the lake session's evidence lifts its turn
    assert found[order.index(lake[2])]["bm25_score"] == found[order.index(build[2])]["bm25_score"]
    assert order.index(lake[2]) < order.index(build[2])
    threads = found[order.index(lake[2])]["explain"]["threads"]
    other = found[order.index(build[2])]["explain"]["threads"]
    # the session's other matches, one and two places before it, lend it their evidence
    assert (threads["near_1_evidence_from"], threads["near_2_evidence_from"]) == (lake[1], lake[0])
    assert threads["near_1_evidence"] > 0 and threads["near_2_evidence"] > 0
    assert other["near_1_evidence"] == other["near_2_evidence"] == 0
    assert [r["score"] for r in found] == sorted((r["score"] for r in found), reverse=True)


def test_a_session_root_never_outranks_its_matching_turns(app, client):
    roots = []
    for n in range(3):
        root, turns = session(client, f"Ann and Bob, session {n}",
                              [f"Ann: the garden needs water today and the roses too {n}",
                               "Bob: I will water them after lunch if the rain holds off",
                               f"Ann: thanks Bob, see you at the weekend market by the station {n}"],
                              start=NOW - 86_400 * (n + 1))
        roots.append((root, turns))
    settled(app)
    found = search(client, "Ann Bob", top_k=20, explain=True)
    order = [r["cid"] for r in found]
    for root, turns in roots:
        # the short header matches both names best by BM25 alone, and still comes after its turns
        assert root in order
        matching = [c for c in turns if c in order and found[order.index(c)]["bm25_score"] > 0]
        assert matching and all(order.index(root) > order.index(c) for c in matching)
        assert found[order.index(root)]["explain"]["threads"]["head"] is True
    # (by BM25 alone a header, short and holding both names, would come first)
    assert max(r["bm25_score"] for r in found) == max(found[order.index(root)]["bm25_score"] for root, _ in roots)


def test_the_turn_beside_a_match_answers_even_when_it_holds_no_query_term(app, client):
    _, turns = session(client, "support chat", ["where did you park the car?", "in the blue garage on level two",
                                                "thanks see you"], start=NOW - 5000)
    push(client, "a car advert with nothing else", timestamp=NOW - 5000)
    settled(app)
    found = search(client, "park car", explain=True)
    by_cid = {r["cid"]: r for r in found}
    answer = by_cid[turns[1]]
    assert answer["bm25_score"] == 0
    assert answer["explain"]["threads"]["near_1_evidence_from"] == turns[0]
    # and it answers the turn before it, which asks
    assert answer["explain"]["threads"]["asked_evidence_from"] == turns[0]
    # a search that asks for every term brings in no unit that lacks them
    assert turns[1] not in {r["cid"] for r in search(client, "park car", operator="and")}


def test_units_that_only_followed_each_other_in_time_bring_in_no_unrelated_neighbor(make_app):
    app = make_app(thread_gap_s=1800)
    client = app.test_client()
    first = push(client, "remember the wifi password rotation", source="cli_v1", timestamp=NOW - 4000)
    other = push(client, "buy oat milk", source="cli_v1", timestamp=NOW - 3900)
    assert unit(client, other)["thread"] == first
    settled(app)
    assert [r["cid"] for r in search(client, "wifi password")] == [first]


def test_a_corpus_without_threads_ranks_by_bm25_alone_as_a_strong_search_does(app, client):
    for i in range(30):
        push(client, f"otter note {i} {'kelp ' * (i % 4)}", timestamp=NOW - 3600 - i)
    settled(app)
    for query in ("otter kelp", "kelp note 7"):
        fast = search(client, query, top_k=30)
        exact = search(client, query, top_k=30, consistency="strong")
        assert [(r["cid"], r["score"], r["bm25_score"]) for r in fast] == \
               [(r["cid"], r["score"], r["bm25_score"]) for r in exact]


def test_a_new_turn_joins_its_thread_before_the_index_has_it(app, client):
    root, turns = session(client, "planning", ["the offsite is in lisbon", "we fly on friday"], start=NOW - 5000)
    settled(app)
    fresh = push(client, "book the hotel near the river", parent_cid=turns[1], timestamp=NOW - 4000)
    found = search(client, "lisbon hotel", explain=True)      # read-your-writes: not in the read index yet
    by_cid = {r["cid"]: r for r in found}
    assert by_cid[fresh]["thread"] == root
    # its thread's other match (lisbon, two places before it) counts for it, as for any unit the index holds
    parts = by_cid[fresh]["explain"]["threads"]
    assert parts["near_2_evidence_from"] == turns[0] and parts["near_2_evidence"] > 0
    assert parts["combined"] > parts["own_share"] + parts["weights"]["thread"] * parts["thread_evidence"]


# --- one ranking on every path (issue 48) -----------------------------------------------------------------
CHATS = [
    ("Ann and Bob, session 1", ["Ann: how was the trip to the lake?", "Bob: cold water, but we swam every morning",
                                "Ann: did the kids like the campfire", "Bob: they roasted marshmallows all night",
                                "Ann: I started pottery classes this week"]),
    ("Ann and Bob, session 2", ["Bob: what are you painting these days?", "Ann: a sunset over the harbour",
                                "Bob: my sister adopted a cat named Bailey", "Ann: cats are great company",
                                "Bob: we plan another camping trip in june"]),
    ("Ann and Bob, session 3", ["Ann: the pottery teacher liked my bowl", "Bob: send me a picture of it",
                                "Ann: sure, and how is Bailey?", "Bob: she sleeps on the piano all day"]),
]
QUESTIONS = ["what did Ann make in pottery class", "where did Bob go camping", "what is the name of the cat",
             "what is Ann painting", "did the kids like the lake trip", "Bob swam in the morning", "Bailey piano",
             "what did Bob's sister adopt"]


def _memory(app) -> None:
    client = app.test_client()
    for n, (title, turns) in enumerate(CHATS):
        session(client, title, turns, start=NOW - 86_400 * (5 - n), source="chat_v1")
    # Ann's and Bob's own notes: the sources a question may name
    push(client, "Ann: note to self, buy clay", source="notes_ann", timestamp=NOW - 4000)
    push(client, "Bob: note to self, tent pegs", source="notes_bob", timestamp=NOW - 3000)


def _answers(client, **kind) -> dict:
    """Per question, the top 10 (CIDs in order) and their scores (the read index's average length is tantivy's,
    the primaries' exact: BM25 agrees to 1e-6)."""
    return {q: [(r["cid"], pytest.approx(r["score"], abs=1e-5), pytest.approx(r["bm25_score"], abs=1e-5))
                for r in search(client, q, top_k=10, **kind)] for q in QUESTIONS}


def test_every_path_ranks_a_threaded_memory_alike(make_app, tmp_path):
    """The same questions over the same units give the same top 10, scores included, from a default search on
    the read index, a strong search, a default search with CONTEXT_REPLICAS=false, and a default search while
    the read index is being built (the primaries answer): one ranking whichever engine found the pool."""
    building = make_app(data_dir=tmp_path / "building")
    app_state(building).maintenance.sync_read_index = lambda writer: 0     # never ready
    _memory(building)
    drain(building)
    settled_app = make_app()
    _memory(settled_app)
    settled(settled_app)
    client = settled_app.test_client()
    default = _answers(client)
    assert all(default.values()) and any(r[2] == 0 for rs in default.values() for r in rs)   # neighbors pulled in
    assert _answers(client, consistency="strong") == default
    off = make_app(replicas=False)       # the same data (folder or schema), no read index
    assert _answers(off.test_client()) == default
    # (another tenant's CIDs are the same: a unit's CID is its content, time and source)
    assert _answers(building.test_client()) == default
    found = search(client, "where did Bob go camping", explain=True)
    assert {r["explain"]["ranking"] for r in found} == {"threads"}


def test_a_question_that_names_a_source_prefers_its_units(app, client):
    _memory(app)
    settled(app)
    found = search(client, "note to self ann", explain=True)
    assert found[0]["source"] == "notes_ann" and found[0]["explain"]["threads"]["named"] is True
    assert found[1]["source"] == "notes_bob" and found[1]["explain"]["threads"]["named"] is False


def test_a_corpus_of_documents_says_bm25_ranked_it(app, client):
    for i in range(5):
        push(client, f"manual page {i} about gaskets", timestamp=NOW - 3600 - i)
    settled(app)
    assert {r["explain"]["ranking"] for r in search(client, "gaskets", explain=True)} == {"bm25"}


# --- context windows -----------------------------------------------------------------------------------
def test_a_window_holds_the_units_beside_a_hit_in_its_own_thread_only(app, client):
    # two threads interleaved in time, and a lone unit between them
    a_root, a = session(client, "thread a", ["alpha one", "alpha two heron", "alpha three", "alpha four"],
                        start=NOW - 9000)
    b_root, b = session(client, "thread b", ["beta one", "beta two heron", "beta three"], start=NOW - 8990)
    push(client, "lone heron", timestamp=NOW - 8900)
    settled(app)
    found = {r["cid"]: r for r in search(client, "heron", neighbors=2, top_k=10)}
    win = found[a[1]]["neighbors"]
    assert [u["cid"] for u in win["before"]] == [a_root, a[0]]
    assert [u["cid"] for u in win["after"]] == [a[2], a[3]]
    assert all(u["thread"] == a_root for u in win["before"] + win["after"])
    assert [u["cid"] for u in found[b[1]]["neighbors"]["after"]] == [b[2]]
    lone = next(r for r in found.values() if r["content"] == "lone heron")
    assert lone["neighbors"] == {"before": [], "after": []}
    assert "neighbors" not in search(client, "heron")[0]


def test_a_window_never_crosses_tenants(make_app):
    keyed = make_app(api_keys="threads-key-aaaaaaaaaa:ta:push+search;threads-key-bbbbbbbbbb:tb:push+search")
    client = keyed.test_client()
    key_a = {"Authorization": "Bearer threads-key-aaaaaaaaaa"}
    key_b = {"Authorization": "Bearer threads-key-bbbbbbbbbb"}
    root, turns = session(client, "thread a", ["kiwi one", "kiwi two"], start=NOW - 5000, headers=key_a)
    # the other tenant: the same units (same CIDs), one more turn
    root_b, turns_b = session(client, "thread a", ["kiwi one", "kiwi two", "kiwi three secret"], start=NOW - 5000,
                              headers=key_b)
    assert (root, turns) == (root_b, turns_b[:2])
    drain(keyed)
    replayed(keyed)
    found = search(client, "kiwi", headers=key_a, neighbors=5)
    seen = {u["content"] for r in found for u in r["neighbors"]["before"] + r["neighbors"]["after"]}
    assert "kiwi three secret" not in seen and seen


def test_a_window_keeps_to_the_requests_project_types_and_source(app, client):
    """Issue 50, L1: one session (metadata.session) prompted in project alpha, then, after a cd, stored a tool
    output in bravo; its root is a system notice. A search scoped to alpha (and to the hook's types) shows
    neither bravo's unit nor the root in the windows of its results, whatever ``neighbors``; a global unit of the
    thread stays; a source filter keeps the windows to that source."""
    meta = lambda project, **more: {"session": "s-1", "project": project, **more}   # noqa: E731
    root = push(client, "session started", type="system_notice", source="hook_v1", metadata=meta("/alpha"),
                timestamp=NOW - 5000)
    asked = push(client, "where does the heron nest", type="user_input", source="hook_v1",
                 metadata=meta("/alpha"), timestamp=NOW - 4990)
    leaked = push(client, "bravo secret tool output", type="tool_output", source="hook_v1_bash",
                  metadata=meta("/bravo"), timestamp=NOW - 4980)
    shared = push(client, "a global note on herons", type="tool_output", source="hook_v1_bash",
                  metadata=meta("/bravo", **{"global": True}), timestamp=NOW - 4970)
    settled(app)
    assert unit(client, leaked)["thread"] == unit(client, asked)["thread"] == unit(client, root)["thread"]

    def window(around=asked, query="heron nest", **params) -> set[str]:
        found = {r["cid"]: r for r in search(client, query, neighbors=5, top_k=10, **params)}
        return {u["cid"] for u in found[around]["neighbors"]["before"] + found[around]["neighbors"]["after"]}
    assert window() == {root, leaked, shared}
    assert window(project="/alpha") == {root, shared}
    assert window(project="/alpha", types=["user_input", "tool_output", "model_thinking"]) == {shared}
    assert window(source="hook_v1") == {root}
    assert window(leaked, "bravo secret", source="hook_v1*", types=["tool_output"], project="/bravo") == {shared}
    packed = client.post("/mcp/context", json={"query": "heron nest", "project": "/alpha",
                                                "types": ["user_input", "tool_output"]}).get_json()
    assert {i["cid"] for i in packed["items"]} <= {asked, shared}


def test_a_windows_budget_counts_each_unit_whole_metadata_included(app, client, monkeypatch):
    """Issue 50, L2: the windows' budget (4 MiB in all, here 200 KiB) counts a unit's metadata too: 20 turns of a
    few characters and 30 KiB of metadata each fill it after six, the rest counted in ``omitted``."""
    from service.store import base
    monkeypatch.setattr(base, "WINDOW_BYTES", 200 << 10)
    big = {"blob": "m" * (30 << 10)}
    root, turns = session(client, "heavy", [f"turn {i} of the heron log" for i in range(20)], start=NOW - 9000,
                          metadata=big)
    settled(app)
    rv = client.post("/mcp/search", json={"query": "heron log", "neighbors": 5, "top_k": 20})
    assert rv.status_code == 200
    windows = [r["neighbors"] for r in rv.get_json()["results"]]
    kept = sum(len(w["before"]) + len(w["after"]) for w in windows)
    assert 0 < kept <= 200 // 30 and sum(w.get("omitted", 0) for w in windows) > 0
    assert sum(len(json.dumps(u)) for w in windows for u in w["before"] + w["after"]) <= 200 << 10


def test_packed_context_carries_each_hits_neighbors_and_drops_them_first(app, client):
    root, turns = session(client, "support chat", ["where did you park the car", "in the blue garage on level two",
                                                "thanks see you"], start=NOW - 5000)
    settled(app)
    rv = client.post("/mcp/context", json={"query": "thanks park", "budget_tokens": 2000}).get_json()
    items = rv["items"]
    assert {i["cid"] for i in items} <= {root, *turns} and len({i["cid"] for i in items}) == len(items)  # each once
    beside = [i for i in items if "neighbor_of" in i]
    assert beside and all(i["neighbor_of"] in {h["cid"] for h in items if "neighbor_of" not in h} for i in beside)
    # a budget for about one item: the neighbors go first
    one = rv["tokens"] - sum(i["tokens"] for i in items) + max(i["tokens"] for i in items)
    tight = client.post("/mcp/context", json={"query": "thanks park", "budget_tokens": one}).get_json()
    assert tight["dropped"] and tight["items"]
    firsts = [d for d in tight["dropped"] if d["reason"] == "over_budget"][:len(beside)]
    assert all("neighbor_of" in d for d in firsts)


def test_dify_and_continue_answer_a_hit_with_its_window(app, client):
    _, turns = session(client, "support chat", ["where did you park the car", "in the blue garage on level two"],
                       start=NOW - 5000)
    settled(app)
    rv = client.post("/retrieval", json={"knowledge_id": "", "query": "park car",
                                         "retrieval_setting": {"top_k": 3, "score_threshold": 0.0}})
    assert rv.status_code == 200, rv.get_data(as_text=True)
    records = rv.get_json()["records"]
    assert records[0]["metadata"]["cid"] == turns[0] and "[system_notice" in records[0]["content"]
    # the answer comes with the question: in its window, or (ranked by threads) as the next record, and once
    answer = [r for r in records if "in the blue garage" in r["content"]]
    assert len(answer) == 1 and answer[0] in records[:2]
    items = client.post("/adapters/continue", json={"query": "park car"}).get_json()
    assert sum("in the blue garage" in i["content"] for i in items[:2]) == 1


def test_explain_shows_every_component(app, client):
    root, turns = session(client, "trip", ["the museum opens at nine", "tickets are twelve euros"], start=NOW - 5000)
    settled(app)
    found = search(client, "museum tickets", explain=True)
    parts = found[0]["explain"]["threads"]
    assert set(parts) >= {"ranking", "combined", "own_share", "thread", "weights", "thread_evidence",
                          "thread_evidence_from", "near_1_evidence", "near_1_evidence_from", "near_2_evidence",
                          "near_2_evidence_from", "asked_evidence", "asked_evidence_from", "named", "length_share"}
    assert parts["ranking"] == "threads" and parts["thread"] == root
    assert parts["thread_evidence_from"] == found[0]["cid"]
    assert parts["near_1_evidence_from"] == found[1]["cid"]
    w = parts["weights"]
    assert parts["combined"] == pytest.approx(
        parts["own_share"] + w["thread"] * parts["thread_evidence"] + w["near_1"] * parts["near_1_evidence"]
        + w["near_2"] * parts["near_2_evidence"] + w["asked"] * parts["asked_evidence"]
        + (w["named"] if parts["named"] else 0) + w["length"] * parts["length_share"], abs=1e-5)
    assert json.dumps(found)        # (plain JSON)


# --- files made before threads -------------------------------------------------------------------------
V1_CATALOG = ("seq INTEGER PRIMARY KEY AUTOINCREMENT, cid TEXT NOT NULL UNIQUE, day TEXT NOT NULL, "
              "timestamp INTEGER NOT NULL, source TEXT NOT NULL, digest TEXT NOT NULL, expires_at INTEGER NOT NULL, "
              "parent_cid TEXT, reserved_ms INTEGER NOT NULL")
V2_UNITS = ("id INTEGER PRIMARY KEY, cid TEXT NOT NULL UNIQUE, seq INTEGER NOT NULL, type TEXT NOT NULL, "
            "source TEXT NOT NULL, timestamp INTEGER NOT NULL, ttl INTEGER NOT NULL, expires_at INTEGER NOT NULL, "
            "content TEXT NOT NULL, metadata TEXT, parent_cid TEXT, pushed_ms INTEGER NOT NULL, "
            "indexed INTEGER NOT NULL DEFAULT 0, ntok INTEGER NOT NULL DEFAULT 0, tokens TEXT")


def _columns(spec: str) -> str:
    return ", ".join(column.split()[0] for column in spec.split(", "))


@pytest.mark.sqlite_only
def test_files_made_before_threads_get_them_by_lineage_when_opened(make_app, tmp_path):
    """A catalog of schema 1 and day files of schema 2 (no threads) are upgraded when the tenant opens: each
    unit joins its parent's thread in acknowledgement order (a unit whose parent expired starts its own), the
    read index is built again with the threads, and new units continue them."""
    import shutil
    import sqlite3
    data = tmp_path / "data"
    app = make_app(data_dir=data)
    client = app.test_client()
    root, turns = session(client, "harbour trip", ["the ferry leaves at noon", "bring the tickets"], start=NOW - 9000)
    deep = push(client, "tickets printed at the kiosk", parent_cid=turns[1], timestamp=NOW - 8000)
    lone = push(client, "an unrelated note about kiosks", timestamp=NOW - 7000)
    before = {cid: unit(client, cid)["thread"] for cid in (root, *turns, deep, lone)}
    drain(app)
    app_state(app).shutdown()
    tenant = data / "tenants" / "default"
    with sqlite3.connect(tenant / "catalog.db") as c:       # the catalog as schema 1 made it
        c.execute("DROP INDEX catalog_thread")
        c.execute(f"CREATE TABLE catalog_v1 ({V1_CATALOG})")
        c.execute(f"INSERT INTO catalog_v1 SELECT {_columns(V1_CATALOG)} FROM catalog")
        c.execute("DROP TABLE catalog")
        c.execute("ALTER TABLE catalog_v1 RENAME TO catalog")
        c.execute("UPDATE meta SET value = 1 WHERE key = 'schema_version'")
    for shard in (tenant / "primary").glob("*.db"):
        with sqlite3.connect(shard) as c:                   # the units table as schema 2 made it
            c.execute(f"CREATE TABLE units_v2 ({V2_UNITS})")
            c.execute(f"INSERT INTO units_v2 SELECT {_columns(V2_UNITS)} FROM units")
            c.execute("DROP TABLE units")
            c.execute("ALTER TABLE units_v2 RENAME TO units")
            c.execute("UPDATE meta SET value = 2 WHERE key = 'schema_version'")
    shutil.rmtree(tenant / "replica" / "index")
    again = make_app(data_dir=data)
    client = again.test_client()
    assert {cid: unit(client, cid)["thread"] for cid in before} == before
    with sqlite3.connect(tenant / "catalog.db") as c:
        places = dict(c.execute("SELECT cid, tpos FROM catalog").fetchall())
    assert [places[c] for c in (root, *turns, deep)] == [0, 1, 2, 3] and places[lone] == 0
    drain(again)
    found = search(client, "ferry kiosk", explain=True)
    assert found and all(r["thread"] == before[r["cid"]] for r in found)
    newer = push(client, "the ferry was late", parent_cid=deep, timestamp=NOW - 100)
    assert unit(client, newer)["thread"] == root
    with sqlite3.connect(tenant / "catalog.db") as c:
        assert c.execute("SELECT tpos FROM catalog WHERE cid = ?", (newer,)).fetchone()[0] == 4


def test_naming_marks_the_same_sources_whether_it_keeps_them_or_not():
    """A source is named by a query token only it holds among the candidates: the same marks from the kept
    sources' tokens (looked up by the query's terms), past the cap on kept sources (source by source), and for
    a source first met after others were kept."""
    from service.ranking.threads import Candidate, Naming
    from service.tokenize import get_tokenizer

    tokenizer = get_tokenizer()

    def marks(naming, sources, query):
        cands = [Candidate(f"{i:012x}", "t", i, 0, 1.0, source=s) for i, s in enumerate(sources)]
        naming.mark(cands, frozenset(tokenizer.tokens(query)))
        return [c.named for c in cands]

    cases = [(["notes_ann", "notes_bob", "notes_ann"], "what did ann write", [True, False, True]),
             (["notes_ann", "notes_bob"], "what are the notes", [False, False]),
             (["notes_ann", "notes_bob", "mail_carol"], "carol and bob", [False, True, True])]
    kept, capped = Naming(tokenizer), Naming(tokenizer)
    capped.MAX = 1
    for sources, query, expected in cases:
        assert marks(kept, sources, query) == expected
        assert marks(capped, sources, query) == expected
    assert len(capped._tokens) == 1 and len(kept._tokens) == 3
