"""How much memory one push body costs a worker while it is decoded (README, Security: "Sizes before
parsing").

For each body shape, a fresh gunicorn with one worker (a fresh worker: its peak RSS, VmHWM, only
grows) gets a warm-up push and search, then one push of that shape, close to the 32 MiB body cap;
the script reports the worker's RSS before, its peak (VmHWM) and the difference, and the answer's
status. The shapes are the attacks on the decoder (many tiny containers, numbers or short strings,
which cost 10-20 times their text as Python objects) and the largest legitimate batches.

    .venv/bin/python bench/decode_bound.py                        # the committed service (HEAD)
    .venv/bin/python bench/decode_bound.py --service-src 12c5159  # an older commit, for comparison

Writes bench/results/decode-bound.json (or --name). Loopback only; one request per case.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from common import TMP, machine, service_rev, service_src, write_json

MIB = 1024 * 1024
BODY = 32 * MIB - 4096            # just under CONTEXT_MAX_BODY_BYTES


def unit(content: str, **extra) -> dict:
    return {"type": "tool_output", "source": "bench_decode_v1", "timestamp": int(time.time()), "ttl": 3600,
            "content": content, **extra}


def filled(prefix: bytes, item: bytes, suffix: bytes, size: int) -> bytes:
    """prefix + item,item,... + suffix, ``size`` bytes at most."""
    n = (size - len(prefix) - len(suffix)) // (len(item) + 1)
    return prefix + b",".join([item] * n) + suffix


def metadata_unit(item: bytes, size: int, content: str = "decode bound") -> bytes:
    head = json.dumps(unit(content))[:-1].encode() + b', "metadata": {"a": ['
    return filled(head, item, b"]}}", size)


def cases() -> dict[str, bytes]:
    out = {
        # finding 6 of issue 25: one unit whose metadata is 32 MiB of empty lists
        "one_unit_metadata_empty_lists": metadata_unit(b"[]", BODY),
        "one_unit_metadata_floats": metadata_unit(b"0.5", BODY),
        "one_unit_metadata_short_strings": metadata_unit(b'"ab"', BODY),
    }
    # many units whose metadata each stays under the 64 KiB cap: all valid, all stored
    one = metadata_unit(b"[]", 60 * 1024, "valid metadata {i}")
    n = BODY // (len(one) + 1)
    out["batch_valid_metadata_empty_lists"] = (b"[" + b",".join(one.replace(b"{i}", str(i).encode())
                                                                 for i in range(n)) + b"]")
    # the largest legitimate batches: 1 MiB contents, ASCII, and ASCII with one emoji (4 bytes a character)
    for name, text in (("batch_1mib_ascii_contents", "a" * (MIB - 64)),
                       ("batch_1mib_wide_contents", "\U0001f600" + "a" * (MIB - 64))):
        units = [unit(f"{i} {text}") for i in range(BODY // (MIB + 256))]
        out[name] = json.dumps(units, ensure_ascii=False).encode()
    out.update(escape_cases())
    return out


def one_field(name: bytes, text: bytes, size: int) -> bytes:
    """One unit whose field ``name`` is ``text`` repeated to fill ``size`` bytes of body."""
    head, tail = b'{"type": "tool_output", ', b'}'
    if name != b"source":
        head += b'"source": "bench_decode_v1", '
    if name != b"content":
        tail = b', "content": "x"' + tail
    inner = size - len(head) - len(tail) - len(name) - 6
    return head + b'"' + name + b'": "' + text * (inner // len(text)) + b'"' + tail


def escape_cases() -> dict[str, bytes]:
    """Issue 39, finding 4: one escaped string cost ~64x its size before its cap was checked. The same body
    size as plain text beside each, so the two compare in one run."""
    out = {"one_unit_source_newline_escapes": one_field(b"source", b"\\n", BODY),
           "one_unit_content_e9_escapes": one_field(b"content", b"\\u00e9", BODY),
           "one_unit_content_plain": one_field(b"content", b"a", BODY)}
    # valid batches of escaped contents (each at most 1 MiB once decoded), as large as the body cap allows
    for name, text, per_unit in (("batch_newline_escape_contents", b"\\n", MIB // 2),
                                 ("batch_e9_escape_contents", b"\\u00e9", MIB // 2 - 64)):
        one = json.dumps(unit("{i}"))[:-1].encode()
        one = one.replace(b'"content": "{i}"', b'"content": "{i} ' + text * per_unit + b'"') + b"}"
        n = BODY // (len(one) + 8)
        out[name] = b"[" + b",".join(one.replace(b"{i}", str(i).encode()) for i in range(n)) + b"]"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def worker_pid(master: int, port: int) -> int:
    """The gunicorn worker: the master's child that holds the listening socket (the maintenance
    process, the other child, closes it)."""
    import psutil
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(master).children():
            try:
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in child.net_connections("tcp")):
                    return child.pid
            except psutil.Error:
                pass
        time.sleep(0.1)
    raise RuntimeError("no worker")


def run_case(src: Path, name: str, body: bytes) -> dict:
    port = free_port()
    data_dir = TMP / f"decode-{os.getpid()}-{name}"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(data_dir), PYTHONPATH=str(src),
               CONTEXT_WORKERS="1", CONTEXT_RATE_LIMIT="off", CONTEXT_ACCESS_LOG="0")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    TMP.mkdir(parents=True, exist_ok=True)
    log = open(TMP / f"decode-{name}-server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", "service/gunicorn_conf.py",
                             "service:create_app()"], cwd=src, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"server did not start (see {log.name})")
            time.sleep(0.2)
        worker = worker_pid(proc.pid, port)
        # warm-up: the first push and search load the tokenizer and open the stores
        requests.post(url + "/mcp/push", json=unit("warm up push"), timeout=60).raise_for_status()
        requests.post(url + "/mcp/search", json={"query": "warm", "consistency": "strong"}, timeout=60)
        idle = status_kib(worker, "VmRSS")
        hwm_before = status_kib(worker, "VmHWM")
        t0 = time.monotonic()
        rv = requests.post(url + "/mcp/push", data=body, headers={"Content-Type": "application/json"}, timeout=600)
        seconds = time.monotonic() - t0
        peak = status_kib(worker, "VmHWM")
        after = status_kib(worker, "VmRSS")
        answer = rv.json()
        summary = answer.get("code") or (f"{sum(r['status'] == 'ok' for r in answer['results'])} of "
                                         f"{len(answer['results'])} ok" if "results" in answer else answer.get("status"))
        return {"case": name, "body_mib": round(len(body) / MIB, 2), "status": rv.status_code, "answer": summary,
                "idle_rss_mib": round(idle / 1024, 1), "peak_rss_mib": round(peak / 1024, 1),
                "peak_over_idle_mib": round((peak - idle) / 1024, 1),
                "rss_after_mib": round(after / 1024, 1), "hwm_before_mib": round(hwm_before / 1024, 1),
                "seconds": round(seconds, 2)}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="decode-bound")
    ap.add_argument("--case", action="append", help="run only these cases")
    args = ap.parse_args(argv)
    src = service_src(args.service_src)
    rows = []
    for name, body in cases().items():
        if args.case and name not in args.case:
            continue
        row = run_case(src, name, body)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = write_json(args.name, {"service": service_rev(src), "machine": machine(), "cases": rows})
    print(out)


if __name__ == "__main__":
    main()
