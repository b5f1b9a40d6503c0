"""Fuzzing (issue 7): schemathesis generates requests from /openapi.json against a live gunicorn.

Every operation, ~300 generated requests each in CI (FUZZ_EXAMPLES raises it for `make fuzz`):
no response is a 5xx, and every 4xx carries the documented error body.
"""
import json
import os
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
KEY = "fuzz-key-0123456789abcdef"
COUNTS = {"requests": 0, "4xx": 0}
PER_OP: dict[str, int] = {}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    from conftest import LiveServer, make_unit
    server = LiveServer(tmp_path_factory.mktemp("fuzz") / "data", workers=2,
                        keys={KEY: ("fuzz", ["push", "search", "admin"])},
                        env={"CONTEXT_RATE_LIMIT": "off"}).start()   # thousands of requests from one key
    # Some real data, so searches and unit reads have something to find.
    for i in range(20):
        requests.post(server.url + "/mcp/push", json=make_unit(f"fuzz seed {i} 订单 ORD-{i}"),
                      headers=server.headers(KEY), timeout=30)
    yield server
    server.stop()
    print(f"\nschemathesis sent {COUNTS['requests']} requests ({COUNTS['4xx']} answered 4xx), no 5xx")
    out = os.environ.get("FUZZ_RESULTS")
    if out:
        path = Path(out)
        prior = json.loads(path.read_text()) if path.exists() else {}
        prior["openapi"] = dict(COUNTS, per_operation=PER_OP)
        path.write_text(json.dumps(prior, indent=1))


def check_error_shape(path: str, response) -> None:
    body = response.json()
    assert isinstance(body, dict), body
    if "retrieval" in path:
        # Dify's External Knowledge API has its own error shape (docs/design.md §8).
        assert isinstance(body.get("error_code"), int) and isinstance(body.get("error_msg"), str), body
    else:
        assert set(body) <= {"error", "code", "field"} and body.get("error") and body.get("code"), body


def fuzz_operation(operation, server) -> int:
    """Send EXAMPLES generated requests for one operation; return how many were sent."""
    sent = []

    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        response = case.call(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        sent.append(response.status_code)
        assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
        if 400 <= response.status_code < 500:
            check_error_shape(case.path, response)

    run()
    COUNTS["requests"] += len(sent)
    COUNTS["4xx"] += sum(400 <= s < 500 for s in sent)
    return len(sent)


def test_every_operation_no_5xx_and_documented_errors(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    # Streams (x-streaming: GET /mcp/stream) never end by themselves: tests/test_stream.py covers them.
    operations = [op for op in (result.ok() for result in schema.get_all_operations())
                  if not op.definition.raw.get("x-streaming")]
    assert len(operations) >= 7
    per_op = {f"{op.method.upper()} {op.path}": fuzz_operation(op, fuzz_server) for op in operations}
    PER_OP.update(per_op)
    print(per_op)
    assert sum(per_op.values()) >= min(2000, EXAMPLES * len(operations) // 2), per_op
