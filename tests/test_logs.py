"""Log lines (service/logs.py, docs/design.md §9) and the request histogram: every access line reaches stderr whole, in logging's own format,
from many threads at once; deferred access lines keep their order with other lines; when logging is configured
otherwise (a handler, a filter, a level) the access line is an ordinary log record."""
import concurrent.futures
import logging
import os
import re
import time

import pytest
import requests

from service.logs import FLUSH_S, LineHandler, direct_handler

ACCESS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO service\.access: tenant=(\S+) method=(\S+) "
                    r"route=(\S+) status=(\d{3}) ms=\d+\.\d")


@pytest.fixture
def pipe_handler(tmp_path):
    """A LineHandler writing to a file, and a function reading its lines once enough arrived (or a timeout)."""
    path = tmp_path / "stderr.log"
    handler = LineHandler(open(path, "w", encoding="utf-8"))

    def read(until: int, timeout: float = 5.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = path.read_text().splitlines()
            if len(lines) >= until or time.monotonic() > deadline:
                return lines
            time.sleep(0.005)
    yield handler, read
    handler.stream.close()


def test_a_deferred_line_is_formatted_as_logging_formats_it(pipe_handler):
    handler, read = pipe_handler
    record = logging.LogRecord("service.access", logging.INFO, __file__, 1, "tenant=- route=/x", None, None)
    handler.emit(record)
    now = record.created
    handler.asctime(now - 3)                  # another second's text cached first
    line = f"{handler.asctime(now)} INFO service.access: tenant=- route=/x"
    assert read(1) == [line]


def test_deferred_lines_arrive_within_the_flush_interval_and_before_a_later_line(pipe_handler):
    handler, read = pipe_handler
    t0 = time.monotonic()
    handler.defer("service.access", "first")
    handler.defer("service.access", "second")
    lines = read(2)
    assert [x.split(": ", 1)[1] for x in lines] == ["first", "second"]
    assert time.monotonic() - t0 < FLUSH_S + 2          # (generous: a loaded machine)
    handler.defer("service.access", "third")
    handler.emit(logging.LogRecord("service", logging.WARNING, __file__, 1, "a warning", None, None))
    lines = read(4)
    assert [x.split(": ", 1)[1] for x in lines[2:]] == ["third", "a warning"]     # the access line first


def test_many_threads_write_whole_lines(pipe_handler):
    handler, read = pipe_handler

    def lines(t):
        for i in range(500):
            handler.defer("service.access", f"thread={t} n={i} " + "x" * 80)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lines, range(8)))
    got = read(4000)
    assert len(got) == 4000
    assert all(re.fullmatch(r".* INFO service\.access: thread=\d n=\d+ x{80}", x) for x in got)
    for t in range(8):                          # each thread's lines in its order
        ns = [int(x.split(" n=")[1].split()[0]) for x in got if f"thread={t} " in x]
        assert ns == list(range(500))


def test_logging_configured_otherwise_gets_an_ordinary_record():
    logger = logging.getLogger("service.access.test")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    handler = LineHandler(open(os.devnull, "w"))
    try:
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        assert direct_handler(logger) is handler
        other = logging.StreamHandler(open(os.devnull, "w"))
        root.addHandler(other)                  # (caplog, or an operator's handler)
        assert direct_handler(logger) is None
        root.removeHandler(other)
        logger.addFilter(lambda r: True)
        assert direct_handler(logger) is None
        logger.filters.clear()
        logger.setLevel(logging.WARNING)
        assert direct_handler(logger) is None
        logger.setLevel(logging.NOTSET)
        handler.setFormatter(logging.Formatter("%(message)s"))
        assert direct_handler(logger) is None
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
        logger.setLevel(logging.NOTSET)


def access_lines(server) -> list[str]:
    return [x for x in server.log_path.read_text(errors="replace").splitlines() if "service.access" in x]


def test_a_server_under_load_writes_one_whole_line_per_request(live_server):
    url = live_server.url
    time.sleep(0.5)                              # the start-up probes' lines written (however many it took)
    before = len(access_lines(live_server))
    session_of = {}

    def get(i):
        s = session_of.setdefault(i % 16, requests.Session())
        return s.get(url + "/healthz", timeout=30).status_code
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(get, range(1600)))
    assert codes == [200] * 1600
    requests.request("FOOBAR", url + "/healthz", timeout=10)
    deadline = time.monotonic() + 10
    while len(lines := access_lines(live_server)) < before + 1601 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(ACCESS.fullmatch(x) for x in lines), [x for x in lines if not ACCESS.fullmatch(x)][:3]
    fields = [ACCESS.fullmatch(x).groups() for x in lines[before:]]
    assert fields.count(("-", "GET", "/healthz", "200")) == 1600
    assert ("-", "other", "unmatched", "405") in fields       # a method a client made up is not echoed
    assert len(fields) == 1601


def test_the_request_histogram_counts_a_made_up_method_as_other(make_app):
    c = make_app().test_client()
    assert c.open("/healthz", method="FOOBAR").status_code == 405
    assert c.get("/healthz").status_code == 200
    text = c.get("/metrics").get_data(as_text=True)
    assert 'method="other",route="unmatched",status="405"' in text
    assert 'method="GET",route="/healthz",status="200"' in text
    assert "FOOBAR" not in text
