"""`make container-smoke`: build the image and run it for real with podman (issue 14).

Checks, in order: the image builds (and its size); the container answers /healthz and its
HEALTHCHECK passes; a push and a Chinese search work with an API key; it runs as a non-root user
who cannot write the code but can write /data, which is 0700; SIGTERM stops it cleanly; a new
container on the same volume still has the unit; a placeholder key stops the start with one log
line. Prints one line per check with timings and exits 1 on the first failure.

Needs podman (Debian: podman, runc) and an image named python:3.11-slim: pulled where Docker
Hub is reachable, else built from Debian packages. tools/container_base.sh installs and configures
podman when it is missing and makes that image.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
IMAGE = os.environ.get("SMOKE_IMAGE", "context-mode-service:smoke")
BASE = "docker.io/library/python:3.11-slim"
TAG = secrets.token_hex(3)
NAME, VOLUME = f"cm-smoke-{TAG}", f"cm-smoke-{TAG}"
KEY = "cms_smoke_" + secrets.token_urlsafe(24)
UID = "10001"


def podman(*args, check=True, timeout=900) -> subprocess.CompletedProcess:
    rv = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and rv.returncode != 0:
        raise SystemExit(f"FAIL  podman {' '.join(args[:3])} ...: exit {rv.returncode}\n{rv.stdout[-2000:]}{rv.stderr[-2000:]}")
    return rv


def report(ok: bool, what: str, seconds: float | None = None) -> None:
    took = f" ({seconds:.1f} s)" if seconds is not None else ""
    print(("ok    " if ok else "FAIL  ") + what + took, flush=True)
    if not ok:
        raise SystemExit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_container(port: int) -> float:
    start = time.monotonic()
    podman("run", "-d", "--name", NAME, "-p", f"127.0.0.1:{port}:5000", "-v", f"{VOLUME}:/data",
           "-e", f"CONTEXT_API_KEYS={KEY}:acme:push+search", IMAGE)
    deadline = start + 120
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return time.monotonic() - start
        except requests.RequestException:
            pass
        if podman("inspect", NAME, "--format", "{{.State.Running}}").stdout.strip() != "true":
            break
        time.sleep(0.1)
    print(podman("logs", NAME, check=False).stderr[-3000:])
    report(False, "container answers /healthz")
    return 0.0


def search(port: int, query: str) -> list[dict]:
    rv = requests.post(f"http://127.0.0.1:{port}/mcp/search", timeout=10, headers={"Authorization": f"Bearer {KEY}"},
                       json={"query": query, "consistency": "strong"})
    rv.raise_for_status()
    return rv.json()["results"]


def refused_start_logs_one_line() -> None:
    """Item 3 of issue 26 in the container: .env.example's placeholder key ends the start with one line."""
    name = f"{NAME}-refused"
    podman("run", "--name", name, "-e", "CONTEXT_API_KEYS=change-me:default:push+search", IMAGE, check=False)
    try:
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        logs = podman("logs", name, check=False)
        lines = [line for line in (logs.stdout + logs.stderr).splitlines() if line.strip()]
        report(state["ExitCode"] != 0 and len(lines) == 1 and "placeholder" in lines[0],
               f"a placeholder key: exit {state['ExitCode']}, {len(lines)} log line: {lines[0][:70] if lines else ''}…")
    finally:
        podman("rm", "-f", name, check=False)


def main() -> None:
    # container_base.sh installs podman and runc when missing, configures them and makes the base image.
    if shutil.which("podman") is None or podman("image", "exists", BASE, check=False).returncode != 0:
        print(f"..    podman or {BASE} not present: tools/container_base.sh sets them up")
        subprocess.run(["bash", str(ROOT / "tools" / "container_base.sh")], check=True, timeout=1800)
    if shutil.which("podman") is None:
        raise SystemExit("podman not found after tools/container_base.sh: apt-get install podman runc")

    start = time.monotonic()
    podman("build", "--format", "docker", "--network", "host", "-t", IMAGE, str(ROOT), timeout=1800)
    report(True, f"image {IMAGE} builds", time.monotonic() - start)
    size = podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip()
    print(f"      image size {int(size) / 1e6:.0f} MB")

    podman("volume", "create", VOLUME)
    port = free_port()
    try:
        report(True, "container starts and answers /healthz", run_container(port))
        report(podman("healthcheck", "run", NAME, check=False).returncode == 0, "HEALTHCHECK passes (podman healthcheck run)")

        content = f"订单 ORD-{TAG} 已发货 container smoke"
        rv = requests.post(f"http://127.0.0.1:{port}/mcp/push", timeout=10, headers={"Authorization": f"Bearer {KEY}"},
                           json={"type": "tool_output", "source": "smoke_v1", "timestamp": int(time.time()),
                                 "ttl": 3600, "content": content})
        report(rv.status_code == 200, f"push with a key: {rv.status_code} {rv.text.strip()[:80]}")
        cid = rv.json()["cid"]
        report(requests.get(f"http://127.0.0.1:{port}/mcp/search?q=x", timeout=10).status_code == 401,
               "no key: 401")
        report([r["cid"] for r in search(port, "订单 发货")][:1] == [cid], "Chinese search finds it (订单 发货)")

        uid = podman("exec", NAME, "id", "-u").stdout.strip()
        report(uid == UID, f"runs as uid {uid}, not root")
        code = podman("exec", NAME, "sh", "-c", "touch /app/service/__init__.py", check=False).returncode
        report(code != 0, "the runtime user cannot rewrite the code (/app is root's)")
        code = podman("exec", NAME, "sh", "-c", "touch /data/.w && rm /data/.w", check=False).returncode
        report(code == 0, "the runtime user can write /data")
        mode = podman("exec", NAME, "stat", "-c", "%a", "/data").stdout.strip()
        logs = podman("logs", NAME, check=False)
        report(mode == "700" and "group/other may read" not in logs.stdout + logs.stderr,
               f"/data is {mode}, no permission warning at start")

        start = time.monotonic()
        podman("stop", "-t", "30", NAME)                   # SIGTERM, SIGKILL only after 30 s
        took = time.monotonic() - start
        state = json.loads(podman("inspect", NAME).stdout)[0]["State"]
        logs = podman("logs", NAME, check=False)
        shut = "Shutting down: Master" in logs.stdout + logs.stderr
        report(state["ExitCode"] == 0 and shut and took < 25,
               f"SIGTERM: gunicorn shut down cleanly, exit {state['ExitCode']}", took)

        podman("rm", NAME)
        report(True, "a new container on the same volume starts", run_container(port))
        report([r["cid"] for r in search(port, "订单 发货")][:1] == [cid], "the unit survived the restart")
        refused_start_logs_one_line()
    finally:
        podman("rm", "-f", "-t", "5", NAME, check=False)
        podman("volume", "rm", "-f", VOLUME, check=False)
    print("container smoke test passed")


if __name__ == "__main__":
    sys.exit(main())
