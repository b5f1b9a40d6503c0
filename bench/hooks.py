"""What one agent hook call costs, beside ``python -c pass`` on the same machine (issue 38's target: the
median hook call within ``python -c pass`` + 60 ms), what bounds a call against a service that never answers,
and how the relevance floor sorts a small probe of prompts.

1. Cost per call. Against an idle local service (a fresh gunicorn, one worker, no keys, the committed
   service), round after round and interleaved (the machine is shared and noisy: compare within a round), each
   case runs as an agent runs a hook: a new process, the event JSON on stdin, its stdout read back.
     pass          python -c pass (the same interpreter: the floor no hook can go under)
     disabled      context-mode-hook with CONTEXT_HOOK_DISABLED=1 (entry point and settings only)
     post_tool     context-mode-hook claude-code PostToolUse: a 2 KB tool output stored (one push)
     prompt        context-mode-hook claude-code UserPromptSubmit: the prompt stored, context asked for
                   (a push and a /mcp/context)
     module        python -m context_mode_client.hook ... PostToolUse (the same code, as a module)
     big_event     post_tool with a 13 MB tool output: the event is over CONTEXT_HOOK_MAX_EVENT_BYTES (8 MiB), read
                   no further, and keeps its head (issue 50 I3: 200,000 characters stored, 100 parts, one push)
     remote_key    post_tool with CONTEXT_HOOK_PROJECT_KEY=remote: the project named by the origin in the
                   repository's .git/config (issue 50 I4)
     service_cli   context-mode hook claude-code PostToolUse (through the service's CLI, which loads the service)
     before_cli    the same, with the service and the client of --before (default 97de0de, before issue 38):
                   what the shipped configs called then
     before_module python -m context_mode_client.hook ... PostToolUse with the client of --before
   Bytecode caches are on, as in an installed package (the environment's PYTHONDONTWRITEBYTECODE is dropped,
   and a first call writes them).
2. The bound. Calls against a server that accepts connections and never answers, with the default
   CONTEXT_HOOK_TIMEOUT_MS (1500): each process's wall time from spawn to exit (the target: within 1600 ms).
3. The relevance floor (CONTEXT_HOOK_MIN_SCORE, 0.5): the best match's score for 8 prompts about 8 stored
   tool outputs and for 10 prompts about nothing stored, and how many of each pass the floor.

    .venv/bin/python bench/hooks.py                  # 40 rounds; --rounds N; --service-src worktree; --before REV

Writes bench/results/hooks.json (or --name). Loopback only.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import requests

from common import TMP, machine, service_rev, service_src, summary, write_json

BIN = Path(sys.executable).parent
OUTPUT = "\n".join(f"step {i}: compiled module_{i} in {i * 7} ms, 0 warnings" for i in range(40))   # ~2 KB
BIG_OUTPUT = "".join(f"line {i:06d} of the nightly build: module_{i % 97} compiled, 0 warnings\n"
                     for i in range(200_000))                                                    # ~13 MB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(src: Path, data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    shutil.rmtree(data_dir, ignore_errors=True)
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(data_dir), PYTHONPATH=str(src),
               CONTEXT_WORKERS="1", CONTEXT_RATE_LIMIT="off", CONTEXT_ACCESS_LOG="0")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = open(data_dir.parent / f"{data_dir.name}-server.log", "wb")
    proc = subprocess.Popen([str(BIN / "gunicorn"), "-c", "service/gunicorn_conf.py", "service:create_app()"],
                            cwd=src, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if requests.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"server did not start (see {log.name})")
        time.sleep(0.2)


def event(name: str, session: str, cwd: str, **fields) -> bytes:
    return json.dumps({"session_id": session, "transcript_path": "/tmp/t.jsonl", "cwd": cwd, "hook_event_name": name,
                       **fields}).encode()


def before_tree(rev: str) -> Path:
    """The service and the Python client as they were at ``rev`` (git archive), to run the old hook beside the new."""
    tree = TMP / f"hooks-before-{rev}"
    if not (tree / "clients" / "python" / "context_mode_client" / "hook.py").exists():
        data = subprocess.run(["git", "archive", rev, "service", "sql", "clients/python"], cwd=BIN.parent.parent,
                              check=True, capture_output=True).stdout
        tree.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            tf.extractall(tree)
    return tree


def cases(cwd: str, before: Path) -> dict:
    """name -> (command, stdin for call i, extra environment). Every call's tool output and prompt is new (a
    repeated one would be a cheaper duplicate push)."""
    def post(i):
        return event("PostToolUse", "bench", cwd, tool_name="Bash", tool_input={"command": "make build"},
                     tool_response={"stdout": f"build {i}\n{OUTPUT}", "stderr": ""})

    def big(i):
        return event("PostToolUse", "bench", cwd, tool_name="Bash", tool_input={"command": "make build"},
                     tool_response={"stdout": f"build {i}\n{BIG_OUTPUT}", "stderr": ""})

    def prompt(i):
        return event("UserPromptSubmit", "bench", cwd, prompt=f"why did module_12 take so long to compile in build {i}?")
    hook = [str(BIN / "context-mode-hook"), "claude-code"]
    return {"pass": ([sys.executable, "-c", "pass"], lambda i: b"", {}),
            "disabled": (hook + ["PostToolUse"], post, {"CONTEXT_HOOK_DISABLED": "1"}),
            "post_tool": (hook + ["PostToolUse"], post, {}),
            "prompt": (hook + ["UserPromptSubmit"], prompt, {}),
            "module": ([sys.executable, "-m", "context_mode_client.hook", "claude-code", "PostToolUse"], post, {}),
            "remote_key": (hook + ["PostToolUse"], post, {"CONTEXT_HOOK_PROJECT_KEY": "remote"}),
            "service_cli": ([str(BIN / "context-mode"), "hook", "claude-code", "PostToolUse"], post, {}),
            "before_cli": ([sys.executable, "-c", "import sys; from service.cli import main; sys.argv[0] = 'context-mode'; "
                            "main()", "hook", "claude-code", "PostToolUse"], post,
                           {"PYTHONPATH": f"{before}{os.pathsep}{before / 'clients' / 'python'}"}),
            "before_module": ([sys.executable, "-m", "context_mode_client.hook", "claude-code", "PostToolUse"], post,
                              {"PYTHONPATH": str(before / "clients" / "python")}),
            # last in a round: the service indexes its 100 parts after it answers, which would slow the next case
            "big_event": (hook + ["PostToolUse"], big, {})}


def timed(cmd: list, stdin: bytes, env: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000, proc.returncode


def cost(url: str, rounds: int, work: Path, before: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CONTEXT_URL=url, CONTEXT_HOOK_STATE_DIR=str(work / "state"), HOME=str(work))
    project = work / "project"
    (project / ".git").mkdir(parents=True, exist_ok=True)
    (project / ".git" / "config").write_text('[core]\n\tbare = false\n[remote "origin"]\n'
                                             '\turl = git@github.com:acme/shop.git\n')   # (as git writes it)
    table = cases(str(project), before)
    calls = 0
    for cmd, stdin, extra in table.values():          # warm-up: bytecode caches written, the service warm
        calls += 1
        timed(cmd, stdin(calls), {**env, **extra})
    times: dict = {name: [] for name in table}
    failed: dict = {name: 0 for name in table}
    for _ in range(rounds):
        for name, (cmd, stdin, extra) in table.items():
            calls += 1
            ms, status = timed(cmd, stdin(calls), {**env, **extra})
            times[name].append(ms)
            failed[name] += status != 0
    log = work / "state" / "hook.log"
    floor = statistics.median(times["pass"])
    out = {name: {**summary(v), "median_over_pass_ms": round(statistics.median(v) - floor, 1),
                  "failed": failed[name]} for name, v in times.items()}
    out["hook_log_lines"] = len(log.read_text().splitlines()) if log.exists() else 0
    # paired within a round: each case minus that round's python -c pass
    out["paired_median_over_pass_ms"] = {name: round(statistics.median(
        [a - b for a, b in zip(v, times["pass"])]), 1) for name, v in times.items() if name != "pass"}
    return out


class Silent:
    """Accepts connections, never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


def bound(calls: int, work: Path, before: Path) -> dict:
    silent = Silent()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CONTEXT_URL=silent.url, CONTEXT_HOOK_STATE_DIR=str(work / "silent-state"), HOME=str(work))
    table = cases(str(work / "project"), before)
    times, statuses = [], []
    try:
        for i in range(calls):
            cmd, stdin, _ = table["prompt" if i % 2 else "post_tool"]
            ms, status = timed(cmd, stdin(i), env)
            times.append(ms)
            statuses.append(status)
    finally:
        silent.close()
    return {"timeout_ms": 1500, **summary(times), "within_1600_ms": sum(t <= 1600 for t in times), "calls": calls,
            "exit_statuses": sorted(set(statuses))}


PROBE_UNITS = [
    "ORD-7731 refund stuck: carrier timeout after 30 s; the refund job retries every 5 minutes",
    "invoice-svc rollout: ORD-4242 stuck at 3/5 replicas, readiness probe failing on /healthz",
    "Decision: pin the carrier client to v2 and raise its timeout to 60 s.",
    "pytest -q tests/test_orders.py: 12 passed, 1 failed (test_refund_idempotent)",
    "git log --oneline: 9f1c2 fix refund rounding; 77ab1 add carrier retries; 1c0de bump flask",
    "npm run build: webpack compiled with 2 warnings (bundle size 1.2 MB exceeds 244 KB)",
    "The README explains how to run the orders service locally with docker compose",
    "Traceback: KeyError 'currency' in billing/invoice.py line 88 when the order has no currency"]
PROBE_PROMPTS = {
    "relevant": ["what did we find about ORD-7731 last time?", "why is the refund stuck?",
                 "fix the KeyError currency in invoice.py", "the invoice-svc rollout is stuck again",
                 "raise the carrier timeout", "which test failed in test_orders?", "ORD-4242 status?",
                 "webpack bundle size warning"],
    "unrelated": ["please write a haiku about autumn leaves", "update the docs for the new API version",
                  "let's write the tests now", "rename the variable foo to bar in utils.py", "what time is it in Tokyo",
                  "add type hints to the parser module", "can you explain how this works?", "make it faster",
                  "run the linter and fix the warnings", "deploy to production"]}


def floor_probe(url: str, floor: float = 0.5) -> dict:
    now = int(time.time())
    for i, text in enumerate(PROBE_UNITS):
        requests.post(url + "/mcp/push", json={"type": "tool_output", "source": "bench_floor", "timestamp": now - 100 + i,
                                               "content": text, "metadata": {"project": "/bench/floor"}}, timeout=30)
    out: dict = {"floor": floor}
    for kind, prompts in PROBE_PROMPTS.items():
        best = []
        for p in prompts:
            rv = requests.post(url + "/mcp/search", json={"query": p, "top_k": 1, "consistency": "strong",
                                                         "project": "/bench/floor"}, timeout=30).json()
            best.append(round(rv["results"][0]["score"], 3) if rv["results"] else 0.0)
        out[kind] = {"best_scores": best, "any_match": sum(b > 0 for b in best), "above_floor": sum(b >= floor for b in best),
                     "n": len(prompts)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--bound-calls", type=int, default=10)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="hooks")
    ap.add_argument("--before", default="97de0de")
    args = ap.parse_args()
    src = service_src(args.service_src)
    before = before_tree(args.before)
    work = TMP / f"hooks-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    proc, url = start_service(src, work / "data")
    try:
        result = {"machine": machine(), "service": service_rev(src), "rounds": args.rounds, "before": args.before,
                  "cost": cost(url, args.rounds, work, before), "bound": bound(args.bound_calls, work, before),
                  "floor_probe": floor_probe(url)}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    c = result["cost"]
    print(f"{'case':12s} {'p50 ms':>8s} {'p95 ms':>8s} {'p50 - pass':>11s} {'paired':>8s}")
    for name in ("pass", "disabled", "post_tool", "prompt", "module", "remote_key", "service_cli", "before_cli",
                 "before_module", "big_event"):
        paired = c["paired_median_over_pass_ms"].get(name, 0.0)
        print(f"{name:12s} {c[name]['p50_ms']:8.1f} {c[name]['p95_ms']:8.1f} {c[name]['median_over_pass_ms']:11.1f} "
              f"{paired:8.1f}")
    b = result["bound"]
    print(f"never-answering service: p50 {b['p50_ms']} ms, max {b['max_ms']} ms, "
          f"{b['within_1600_ms']}/{b['calls']} within 1600 ms, exit {b['exit_statuses']}")
    f = result["floor_probe"]
    print(f"floor {f['floor']}: relevant {f['relevant']['above_floor']}/{f['relevant']['n']} pass, unrelated "
          f"{f['unrelated']['above_floor']}/{f['unrelated']['n']} pass ({f['unrelated']['any_match']} match at all)")
    write_json(args.name, result)


if __name__ == "__main__":
    main()
