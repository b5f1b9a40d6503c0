"""Large answers cannot hold the workers (issue 39, finding 2), without nginx in front: a search answers at most
4 MiB of contents (100 results of 1 MB units answered 98 MB), and a worker writes at most its share of answers
over CONTEXT_LARGE_ANSWER_BYTES per key and per tenant at once, refusing more at once (429 + Retry-After)
rather than handing a slow reader another thread. The load itself (16 slow readers, the other tenant's
/healthz and searches) is measured by bench/large_answers.py."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest
import requests

from conftest import LiveServer, make_unit
from service.ranking.results import ANSWER_CONTENT_BYTES

BACKENDS = ("sqlite", "postgresql")
MB = 1 << 20


FILLER = "the quick brown fox jumps over the lazy dog while 快速的狐狸 watches "


def big_units(n: int, word: str, size: int = MB - 512) -> list[dict]:
    """``n`` units of about ``size`` bytes of ordinary words."""
    body = (FILLER * (size // len(FILLER.encode()) + 1)).encode()[:size - 40].decode("utf-8", "ignore")
    return [make_unit(f"{word} {i} {body}", source=f"big_v{i}") for i in range(n)]


def test_a_search_answers_at_most_its_byte_bound_on_every_door(make_app):
    app = make_app()
    c = app.test_client()
    rv = c.post("/mcp/push", json=big_units(7, "boulder"))
    assert all(r["status"] == "ok" for r in rv.get_json()["results"])
    for consistency in ("strong", "replica"):
        found = c.post("/mcp/search", json={"query": "boulder", "top_k": 100, "consistency": consistency}).get_json()
        assert "results" in found, found
        sizes = [len(r["content"].encode()) for r in found["results"]]
        assert 1 <= len(sizes) < 7 and sum(sizes) <= ANSWER_CONTENT_BYTES, (consistency, sizes)
        assert len(sizes) == ANSWER_CONTENT_BYTES // (MB - 512)                # as many as fit, no fewer
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": "context_search", "arguments": {"query": "boulder", "top_k": 50}}}
    rv = c.post("/mcp", json=rpc, headers={"Accept": "application/json, text/event-stream",
                                           "MCP-Protocol-Version": "2025-11-25"})
    assert "result" in rv.get_json(), str(rv.get_json())[:500]
    assert len(rv.get_json()["result"]["structuredContent"]["results"]) == 4
    rv = c.post("/retrieval", json={"knowledge_id": "", "query": "boulder", "retrieval_setting": {"top_k": 100}})
    assert len(rv.get_json()["records"]) == 4
    # one result larger than the bound alone is still answered (the first always is)
    small = make_app(max_content_bytes=8 * MB, max_body_bytes=32 * MB, data_dir=app.config["CONTEXT"].data_dir + "-x")
    c = small.test_client()
    c.post("/mcp/push", json=big_units(1, "pebble", 5 * MB)[0])
    assert len(c.post("/mcp/search", json={"query": "pebble", "consistency": "strong"}).get_json()["results"]) == 1


# --- the share of large answers, on a real gunicorn worker -------------------------------------------------------
A_KEY, A_OTHER_KEY, B_KEY = "answers-a-0123456789abcdef", "answers-a2-0123456789abcde", "answers-b-0123456789abcdef"
KEYS = {A_KEY: ("alpha", ["push", "search"]), A_OTHER_KEY: ("alpha", ["search"]), B_KEY: ("beta", ["push", "search"])}


@pytest.fixture
def server(tmp_path):
    s = LiveServer(tmp_path / "data", workers=1, keys=KEYS,
                   env={"CONTEXT_LARGE_ANSWER_BYTES": str(256 * 1024), "CONTEXT_LARGE_ANSWER_SHARE": "1",
                        "CONTEXT_RATE_LIMIT": "off", "CONTEXT_SLOW_CLIENT_GRACE_S": "60"})
    try:
        yield s.start()
    finally:
        s.stop()


def slow_reader(server, path: str, key: str) -> socket.socket:
    """A client that asks for an answer and reads none of it (its receive buffer kept small)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
    return sock


def test_a_key_and_a_tenant_write_at_most_their_share_of_large_answers(server):
    for key, word in ((A_KEY, "alpha"), (B_KEY, "beta")):
        rv = requests.post(server.url + "/mcp/push", json=big_units(12, word), headers=server.headers(key), timeout=60)
        assert all(r["status"] == "ok" for r in rv.json()["results"]), rv.text[:300]
    requests.post(server.url + "/mcp/push", json=make_unit("alpha, small", source="small_v1"),
                  headers=server.headers(A_KEY), timeout=10).raise_for_status()
    deadline = time.monotonic() + 180                           # indexed, so that a search is quick
    while len(requests.post(server.url + "/mcp/search", json={"query": "alpha", "top_k": 1},
                            headers=server.headers(A_KEY), timeout=60).json()["results"]) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    held = slow_reader(server, "/mcp/export", A_KEY)            # 12 MB: its thread writes it, paced
    try:
        time.sleep(1.0)
        for key in (A_KEY, A_OTHER_KEY):                        # the same key, and another key of the same tenant
            rv = requests.get(server.url + "/mcp/export", headers=server.headers(key), timeout=10)
            assert rv.status_code == 429 and rv.json()["code"] == "too_many_large_answers", rv.text[:300]
            assert rv.headers["Retry-After"] == "1"
            rv = requests.post(server.url + "/mcp/search", json={"query": "alpha", "top_k": 10},
                               headers=server.headers(key), timeout=30)
            assert rv.status_code == 429, rv.text[:300]             # a 4 MiB search answer is a large one too
        # a small answer of the same tenant, and the other tenant's large ones, are served meanwhile
        rv = requests.get(server.url + "/mcp/export?source=small_v1", headers=server.headers(A_KEY), timeout=10)
        assert rv.status_code == 200 and json.loads(rv.text)["content"] == "alpha, small"
        rv = requests.get(server.url + "/mcp/export", headers=server.headers(B_KEY), timeout=60)
        assert rv.status_code == 200 and len(rv.text.splitlines()) == 12
        assert requests.get(server.url + "/healthz", timeout=5).status_code == 200
    finally:
        held.close()
    # the slot comes back once the reader is gone
    deadline = time.monotonic() + 15
    while True:
        rv = requests.get(server.url + "/mcp/export", headers=server.headers(A_KEY), timeout=60)
        if rv.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rv.status_code == 200 and len(rv.text.splitlines()) == 13
    assert all(json.loads(line)["content"].startswith("alpha") for line in rv.text.splitlines())


def kept_on_disk(server) -> int:
    """Bytes of the unlinked temporary files the server's workers hold open (what they keep for slow readers; made
    with O_TMPFILE, such a file has no name of its own)."""
    from workers import worker_pids
    total = 0
    for pid in worker_pids(server.proc.pid):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(" (deleted)"):
                    total += os.stat(f"/proc/{pid}/fd/{fd}").st_size
            except OSError:
                pass                                            # (closed meanwhile)
    return total


@pytest.mark.sqlite_only
def test_a_key_keeps_at_most_its_cap_for_slow_readers(tmp_path):
    """Issue 50, M3: each answer under 8 MiB a slow reader does not take was kept by the worker's poller, without a
    cap (64 sockets of one key held 468 MB of temporary files). Now a worker keeps at most
    CONTEXT_SLOW_READER_KEY_BYTES per key (and CONTEXT_SLOW_READER_BYTES in all); past it the thread writes the
    answer at the reader's pace, and every answer still arrives whole."""
    cap = 2 * MB
    s = LiveServer(tmp_path / "data", workers=1, keys=KEYS,
                   env={"CONTEXT_SLOW_READER_KEY_BYTES": str(cap), "CONTEXT_RATE_LIMIT": "off",
                        "CONTEXT_SLOW_CLIENT_GRACE_S": "60", "CONTEXT_THREADS": "16"}).start()
    readers = []
    try:
        rv = requests.post(s.url + "/mcp/push", json=big_units(1, "alpha"), headers=s.headers(A_KEY), timeout=60)
        assert rv.json()["results"][0]["status"] == "ok", rv.text[:300]
        whole = requests.get(s.url + "/mcp/export", headers=s.headers(A_KEY), timeout=60).content
        assert len(whole) > 900_000
        readers = [slow_reader(s, "/mcp/export", A_KEY) for _ in range(10)]   # ~10 MB not read
        deadline, kept = time.monotonic() + 20, 0
        while time.monotonic() < deadline:                      # (until the kept ones are all written out)
            time.sleep(0.5)
            kept = max(kept, kept_on_disk(s))
            if kept >= cap:
                break
        time.sleep(1.0)
        kept = max(kept, kept_on_disk(s))
        assert 0 < kept <= cap, kept                            # before: about 10 x (1 MB - 256 KiB in memory)
        assert requests.get(s.url + "/healthz", timeout=5).status_code == 200
        for sock in readers:                                    # every answer arrives whole
            sock.settimeout(60)
            data = b""
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < len(whole):
                piece = sock.recv(1 << 16)
                assert piece, data[:200]
                data += piece
            head, body = data.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200") and body[:len(whole)] == whole
    finally:
        for sock in readers:
            sock.close()
        s.stop()
