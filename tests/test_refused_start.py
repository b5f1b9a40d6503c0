"""Issue 26, item 3: a configuration the service refuses ends the start with one line and a non-zero exit,
before any worker forks: from gunicorn (as `make run` and the image start it), `context-mode serve`,
`context-mode doctor` (which `make run` and the image run first), and the Dockerfile's CMD."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import ROOT, VENV_BIN, free_port

CLI = Path(sys.executable).parent / "context-mode"


# Files the configurations below name (written into each test's tmp_path).
FILES = {"empty.json": '{"keys": []}', "broken.json": '{"keys": [',
         "short.json": json.dumps({"keys": [{"key": "tiny", "tenant": "acme", "scopes": ["push"]}]})}
# name -> (environment, a phrase the one line must hold)
REFUSED = {
    "empty keys file": ({"CONTEXT_API_KEYS_FILE": "{tmp}/empty.json"}, "holds no keys"),
    "keys file not JSON": ({"CONTEXT_API_KEYS_FILE": "{tmp}/broken.json"}, "not valid JSON"),
    "keys file missing": ({"CONTEXT_API_KEYS_FILE": "{tmp}/absent.json"}, "cannot read it"),
    "short key in a file": ({"CONTEXT_API_KEYS_FILE": "{tmp}/short.json"}, "at least 16 characters"),
    "CONTEXT_API_KEYS_FILE= (empty)": ({"CONTEXT_API_KEYS_FILE": ""}, "CONTEXT_API_KEYS_FILE is set but empty"),
    "compose's change-me": ({"CONTEXT_API_KEYS": "change-me:default:push+search"}, "placeholder"),
    "public bind, no keys": ({"CONTEXT_BIND": "0.0.0.0:{port}"}, "is not loopback"),
    "unknown store": ({"CONTEXT_STORE": "mysql://db/x"}, "CONTEXT_STORE must be"),
    "not a number": ({"CONTEXT_WORKERS": "two"}, "CONTEXT_WORKERS='two' is not a whole number"),
}
CASES = list(REFUSED)


def environment(tmp_path, name: str | None) -> tuple[dict, str]:
    """A clean CONTEXT_* environment on a free loopback port, with the named refused configuration."""
    for file, text in FILES.items():
        (tmp_path / file).write_text(text)
    extra, phrase = REFUSED[name] if name else ({}, "")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_")}
    env.update(CONTEXT_DATA_DIR=str(tmp_path / "data"), CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_WORKERS="1",
               PATH=str(VENV_BIN) + os.pathsep + os.environ.get("PATH", ""))
    env.update({k: v.format(port=port, tmp=tmp_path) for k, v in extra.items()})
    return env, phrase


def assert_one_line(rv: subprocess.CompletedProcess, phrase: str, prefix: str) -> None:
    out = (rv.stdout + rv.stderr).strip()
    assert rv.returncode != 0, out
    assert "Traceback" not in out and "Worker failed to boot" not in out and "Booting worker" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith(prefix) and phrase in lines[0], lines[0]


@pytest.mark.parametrize("name", CASES)
def test_gunicorn_refuses_in_one_line_before_any_worker(tmp_path, name):
    env, phrase = environment(tmp_path, name)
    started = time.monotonic()
    rv = subprocess.run([str(VENV_BIN / "gunicorn"), "-c", "service/gunicorn_conf.py", "service:create_app()"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert_one_line(rv, phrase, "context-mode: refusing to start: ")
    assert time.monotonic() - started < 30          # refused at once, not after workers tried


@pytest.mark.parametrize("name", CASES)
def test_doctor_says_why_in_one_line(tmp_path, name):
    env, phrase = environment(tmp_path, name)
    rv = subprocess.run([str(CLI), "doctor", "--quiet"], env=env, capture_output=True, text=True, timeout=60)
    assert_one_line(rv, phrase, "FAIL  configuration refused: ")


@pytest.mark.parametrize("name", ["compose's change-me", "CONTEXT_API_KEYS_FILE= (empty)", "public bind, no keys"])
def test_serve_refuses_in_one_line(tmp_path, name):
    env, phrase = environment(tmp_path, name)
    rv = subprocess.run([str(CLI), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert_one_line(rv, phrase, "Error: refusing to start: ")


def test_the_images_cmd_with_the_shipped_placeholder_key_logs_one_line(tmp_path):
    """What `docker compose logs` shows when .env still holds .env.example's key: one line, exit 1."""
    from test_docker_files import INSTR, exec_form
    env, phrase = environment(tmp_path, "compose's change-me")
    cmd = exec_form([a for w, a in INSTR if w == "CMD"][-1])
    rv = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert_one_line(rv, phrase, "FAIL  configuration refused: CONTEXT_API_KEYS (under docker compose: CONTEXT_API_KEY")


def test_a_good_configuration_still_starts_and_doctor_reports_its_keys(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"key": "good-0123456789abcdef", "tenant": "acme", "scopes": ["push"]}]}))
    env, _ = environment(tmp_path, None)
    env["CONTEXT_API_KEYS_FILE"] = str(keys)
    rv = subprocess.run([str(CLI), "doctor"], env=env, capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stdout + rv.stderr
    assert "ok    configuration: 1 API key(s) for tenant(s) acme" in rv.stdout


def test_the_older_allow_list_names_work_with_a_warning(tmp_path):
    """Issue 26, item 6: CONTEXT_ALLOWED_HOSTS is the name; CONTEXT_MCP_ALLOWED_HOSTS still adds hosts, and says so."""
    from conftest import LiveServer
    server = LiveServer(tmp_path / "data", workers=1, env={"CONTEXT_MCP_ALLOWED_HOSTS": "old-name.internal"})
    try:
        server.start()
        url = server.url + "/mcp/units/0123456789ab"
        assert requests.get(url, headers={"Host": "old-name.internal"}, timeout=10).status_code == 404
        assert requests.get(url, headers={"Host": "other.internal"}, timeout=10).status_code == 403
        assert "CONTEXT_MCP_ALLOWED_HOSTS is the older name of CONTEXT_ALLOWED_HOSTS" in server.log()
    finally:
        server.stop()


class LateForwarder:
    """A TCP port that starts forwarding to PostgreSQL only when told: a database that comes up late."""

    def __init__(self, target_port: int):
        self.port, self.target = free_port(), target_port
        self.sock: socket.socket | None = None

    def open(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self.sock:
            self.sock.close()


def test_gunicorn_waits_for_a_database_that_answers_late(tmp_path, pg_urls):
    """Item 11: under compose the service started before PostgreSQL and restart-looped; now it waits
    (CONTEXT_STORE_WAIT_S) in the master and serves once the database answers."""
    from conftest import LiveServer
    primary = pg_urls[0]
    real_port = int(primary.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    late = LateForwarder(real_port)
    store = primary.replace(f":{real_port}/", f":{late.port}/")
    server = LiveServer(tmp_path / "data", workers=1, env={"CONTEXT_STORE": store, "CONTEXT_STORE_WAIT_S": "60"})
    try:
        server.data_dir.mkdir(parents=True)
        server._log = open(server.log_path, "ab")
        server.proc = subprocess.Popen([str(VENV_BIN / "gunicorn"), "-c", str(server.conf), "service:create_app()"],
                                       cwd=ROOT, env=server.env, stdout=server._log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.monotonic() + 30
        while "waiting up to 60 s for the database" not in server.log():
            assert server.proc.poll() is None and time.monotonic() < deadline, server.log()
            time.sleep(0.2)
        time.sleep(1.5)
        assert server.proc.poll() is None and "Booting worker" not in server.log()     # still waiting, no restarts
        late.open()
        deadline = time.monotonic() + 60
        while True:
            assert server.proc.poll() is None and time.monotonic() < deadline, server.log()
            try:
                if requests.get(server.url + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        assert server.log_path.read_text(errors="replace").count("waiting up to") == 1   # (the whole log)
    finally:
        server.stop()
        late.close()


def test_a_database_that_never_answers_is_one_line_after_the_wait(tmp_path):
    env, _ = environment(tmp_path, None)
    env.update(CONTEXT_STORE=f"postgresql://context:pw@127.0.0.1:{free_port()}/context", CONTEXT_STORE_WAIT_S="2")
    started = time.monotonic()
    rv = subprocess.run([str(VENV_BIN / "gunicorn"), "-c", "service/gunicorn_conf.py", "service:create_app()"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    out = (rv.stdout + rv.stderr).strip().splitlines()
    assert rv.returncode == 1 and time.monotonic() - started >= 2
    assert [line.split(":")[0] for line in out] == ["context-mode", "context-mode"], out   # waiting, then refused
    assert out[-1].startswith("context-mode: refusing to start: PostgreSQL at postgresql://context:***@")
    assert "(waited 2 s, CONTEXT_STORE_WAIT_S)" in out[-1] and ":pw@" not in "\n".join(out)
