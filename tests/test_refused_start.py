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

from conftest import ROOT, VENV_BIN, free_port, stop_group, wait_healthy

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
    # issue 39, finding 1: every sandboxed iframe, file:// page and data: URL sends Origin null
    "origin null, no keys": ({"CONTEXT_ALLOWED_ORIGINS": "null"}, "lists 'null' and no API keys"),
    "origin *, no keys": ({"CONTEXT_ALLOWED_ORIGINS": "https://app.example,*"}, "lists '*' and no API keys"),
    "origin null by its older name": ({"CONTEXT_MCP_ALLOWED_ORIGINS": "null"}, "lists 'null' and no API keys"),
    "not a rate limit": ({"CONTEXT_RATE_LIMIT": "lots"}, "is not a rate limit"),
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
    assert "ok    live streams: 4 per worker x 1 workers = 4 (CONTEXT_MAX_STREAMS of CONTEXT_THREADS 8)" in rv.stdout


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
        wait_healthy(server.proc, server.url, 60, server.log)
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


# --- the addresses gunicorn really listens on (issue 25, finding 8) ----------------------------------
GUNICORN = [str(VENV_BIN / "gunicorn"), "-c", "service/gunicorn_conf.py", "service:create_app()"]


def assert_refused_before_any_worker(rv: subprocess.CompletedProcess, phrase: str) -> str:
    """Exit 1, our one line last; before it at most gunicorn's own "Starting gunicorn" (it logs that before
    any hook runs); no worker, no traceback, nothing listening."""
    out = (rv.stdout + rv.stderr).strip()
    lines = [line for line in out.splitlines() if line.strip()]
    assert rv.returncode == 1, out
    assert lines[-1].startswith("context-mode: refusing to start: ") and phrase in lines[-1], out
    assert all("Starting gunicorn" in line for line in lines[:-1]), out
    assert "Booting worker" not in out and "Traceback" not in out
    return lines[-1]


@pytest.mark.parametrize("how, host", [("GUNICORN_CMD_ARGS", "0.0.0.0"), ("-b", "0.0.0.0"), ("-b", "[::]")])
def test_no_keys_on_a_public_address_is_refused_whatever_named_it(tmp_path, how, host):
    """CONTEXT_BIND stays loopback; gunicorn is told another address by its own means: refused before it binds."""
    env, _ = environment(tmp_path, None)
    port = free_port()
    cmd = list(GUNICORN)
    if how == "-b":
        cmd[1:1] = ["-b", f"{host}:{port}"]
    else:
        env["GUNICORN_CMD_ARGS"] = f"--bind {host}:{port}"
    rv = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    line = assert_refused_before_any_worker(rv, f"gunicorn listens on {host}:{port}, "
                                                "which is not loopback")
    assert "CONTEXT_ALLOW_OPEN=1" in line and "GUNICORN_CMD_ARGS" in line


def test_an_inherited_public_socket_is_refused_once_bound(tmp_path):
    """What gunicorn was handed (systemd's sockets, a re-exec's) is checked once it listens (when_ready): a test
    configuration adds such a listener on a public address to the real ones."""
    conf = tmp_path / "public_listener_conf.py"
    conf.write_text(
        "from service.gunicorn_conf import *  # noqa: F401,F403\n"
        "from service import gunicorn_conf as base\n\n\n"
        "class PublicListener:\n"
        "    def getsockname(self):\n"
        "        return ('192.0.2.10', 5000)\n\n\n"
        "def when_ready(server):\n"
        "    server.LISTENERS = [*server.LISTENERS, PublicListener()]\n"
        "    base.when_ready(server)\n")
    env, _ = environment(tmp_path, None)
    rv = subprocess.run([str(VENV_BIN / "gunicorn"), "-c", str(conf), "service:create_app()"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60)
    out = (rv.stdout + rv.stderr).strip()
    assert rv.returncode == 1 and "Booting worker" not in out and "Traceback" not in out, out
    assert out.splitlines()[-1].startswith("context-mode: refusing to start: No API keys are configured and gunicorn "
                                           "listens on 192.0.2.10:5000, which is not loopback"), out


def test_loopback_named_by_gunicorn_args_or_keys_start(tmp_path):
    """The rule refuses only what it must: a loopback --bind without keys, and a public one with keys."""
    from service.preflight import Refused, check_listeners
    from service.config import Config
    env, _ = environment(tmp_path, None)
    port = free_port()
    env["GUNICORN_CMD_ARGS"] = f"--bind 127.0.0.1:{port}"
    proc = subprocess.Popen(GUNICORN, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", 60)
    finally:
        stop_group(proc, timeout=30)
    open_config = Config.from_mapping({})
    for local in [("127.0.0.1", 1), ("::1", 1, 0, 0), ("::ffff:127.0.0.1", 1, 0, 0), ("localhost", 1), "/tmp/s.sock", 3]:
        check_listeners(open_config, [local])
    for public in [("0.0.0.0", 1), ("", 1), ("::", 1, 0, 0), ("10.1.2.3", 1), ("example.internal", 1)]:
        with pytest.raises(Refused, match="which is not loopback"):
            check_listeners(open_config, [public])
    check_listeners(open_config.replace(allow_open=True), [("0.0.0.0", 1)])
    check_listeners(Config.from_mapping({"api_keys": "k-0123456789abcdef:acme:push"}), [("0.0.0.0", 1)])


@pytest.mark.parametrize("setting", ["api_keys_file", "api_keys"])
@pytest.mark.parametrize("value", ["", "  "])
def test_a_keys_setting_set_but_empty_is_an_error_on_every_path(tmp_path, setting, value):
    """Finding 13: CONTEXT_API_KEYS_FILE= (or CONTEXT_API_KEYS=) is a mistake, never "no keys": refused from the
    environment (gunicorn, serve, doctor: above) and from a mapping or a Config (an embedding program, tests)."""
    from service import create_app, preflight
    from service.auth import KeyRing
    from service.config import Config
    name = "CONTEXT_" + setting.upper()
    with pytest.raises(preflight.Refused, match=f"{name} is set but empty"):
        preflight.check({name: value, "CONTEXT_DATA_DIR": str(tmp_path / "d")}, wait=False)
    with pytest.raises(ValueError, match=f"{name} is set but empty"):
        KeyRing.from_config(Config(**{setting: value}))
    with pytest.raises(ValueError, match=f"{name} is set but empty"):
        create_app({"data_dir": str(tmp_path / "d"), "background": False, setting: value})
