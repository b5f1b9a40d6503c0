"""The package runs its own server (issue 51): the wheels built from this checkout, installed into a fresh venv
with nothing else of the repository, start the real gunicorn with `context-mode run`, keep their data in the
platform's data folder, and answer a push and a search; a clean stop leaves nothing running."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from conftest import ROOT, VENV_BIN, free_port, wait_healthy


def test_an_installed_wheel_runs_the_real_server(tmp_path):
    dist, venv, home = tmp_path / "dist", tmp_path / "venv", tmp_path / "home"
    left = [ROOT / "build", ROOT / "clients" / "python" / "build"]          # setuptools builds in the tree
    made = [d for d in left if not d.exists()]
    try:
        subprocess.run([str(VENV_BIN / "pip"), "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT),
                        str(ROOT / "clients" / "python")], check=True, capture_output=True, timeout=600)
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == ["context_mode_client", "context_mode_service"]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *map(str, dist.glob("*.whl"))], check=True,
                   capture_output=True, timeout=900)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXT_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), XDG_DATA_HOME="")
    proc = subprocess.Popen([str(venv / "bin" / "context-mode"), "run", "--bind", f"127.0.0.1:{port}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 90)
        ack = requests.post(url + "/mcp/push", json={"content": "安装好的轮子 wheel", "type": "user_input",
                                                     "source": "wheel_test"}, timeout=10).json()
        found = requests.post(url + "/mcp/search", json={"query": "轮子", "consistency": "strong"}, timeout=10)
        assert [r["cid"] for r in found.json()["results"]] == [ack["cid"]]
        data = home / ".local" / "share" / "context-mode"
        assert (data / "tenants").is_dir() and not (tmp_path / "data").exists()
        assert oct(data.stat().st_mode & 0o777) == "0o700"
        gunicorn = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "gunicorn" in gunicorn and "gunicorn_conf.py" in gunicorn     # the shipped configuration
        remembered(venv, url, tmp_path / "my-project", env)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    assert f"context-mode: data in {home}/.local/share/context-mode" in out
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).stdout == b""


def remembered(venv: Path, url: str, project: Path, env: dict) -> None:
    """The README's third command, from the installed package: `context-mode install claude-code` in a project;
    its hooks, run as Claude Code runs them (a shell, no PATH to the venv, the event on stdin), store a session's
    prompt, and the next session's prompt is given it back as context."""
    import json
    (project / ".git").mkdir(parents=True)
    out = subprocess.run([str(venv / "bin" / "context-mode"), "install", "claude-code", "--url", url], cwd=project,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "answers" in out.stdout, out.stdout + out.stderr
    hooks = json.loads((project / ".claude" / "settings.json").read_text())["hooks"]
    shell = {"PATH": "/usr/bin:/bin", "HOME": env["HOME"]}

    def hook(event, session, **fields):
        command = hooks[event][0]["hooks"][0]["command"]
        assert f" {venv}/bin/context-mode-hook " in command             # the installed package's own hook
        event_json = json.dumps({"session_id": session, "cwd": str(project), "hook_event_name": event, **fields})
        rv = subprocess.run(command, shell=True, input=event_json, capture_output=True, text=True, env=shell,
                            timeout=30)
        assert rv.returncode == 0, rv.stderr
        return rv.stdout
    hook("SessionStart", "wheel-1", source="startup")
    hook("UserPromptSubmit", "wheel-1", prompt="the invoice export times out after 30 seconds on large months")
    time.sleep(1.1)                                                     # (earlier sessions: an earlier second)
    hook("SessionStart", "wheel-2", source="startup")
    answer = json.loads(hook("UserPromptSubmit", "wheel-2", prompt="why does the invoice export time out?"))
    context = answer["hookSpecificOutput"]["additionalContext"]
    assert "the invoice export times out after 30 seconds" in context

