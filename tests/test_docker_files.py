"""Dockerfile and docker-compose.yml, checked without a Docker engine (none exists here).

Run when installed (.ci/setup.d/docker-lint.sh installs both): hadolint on the Dockerfile and
Debian's docker-compose v1 `config`, which parses, interpolates and validates offline. Always:
structural assertions, and the image's HEALTHCHECK and CMD commands run for real against a local
gunicorn. Not run: `docker build` and starting containers.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from conftest import ROOT, free_port

DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE_PATH = ROOT / "docker-compose.yml"
COMPOSE = yaml.safe_load(COMPOSE_PATH.read_text())
DIFY_OVERRIDE_PATH = ROOT / "docker-compose.dify.yml"
DIFY_OVERRIDE = yaml.safe_load(DIFY_OVERRIDE_PATH.read_text())
PG_OVERRIDE_PATH = ROOT / "docker-compose.postgres.yml"
PG_OVERRIDE = yaml.safe_load(PG_OVERRIDE_PATH.read_text())
HADOLINT = shutil.which("hadolint")
DOCKER_COMPOSE = shutil.which("docker-compose")
VENV_BIN = str(Path(sys.executable).parent)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


INSTR = instructions(DOCKERFILE)


def exec_form(args: str) -> list[str]:
    import json
    return json.loads(args)


# --- validators ---------------------------------------------------------------------------------
@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (run .ci/setup.d/docker-lint.sh): Dockerfile not linted")
def test_hadolint_passes():
    rv = subprocess.run([HADOLINT, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stdout + rv.stderr


def compose(*args, env=None, env_file=None, dify=False, postgres=False):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONTEXT_", "DIFY_", "COMPOSE_", "POSTGRES_"))}
    environ.update(env or {})
    cmd = [DOCKER_COMPOSE, "--project-directory", str(ROOT), "-f", str(COMPOSE_PATH)]
    if dify:
        cmd += ["-f", str(DIFY_OVERRIDE_PATH)]
    if postgres:
        cmd += ["-f", str(PG_OVERRIDE_PATH)]
    if env_file:
        cmd += ["--env-file", str(env_file)]
    return subprocess.run(cmd + list(args), cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


needs_compose = pytest.mark.skipif(DOCKER_COMPOSE is None,
                                   reason="docker-compose not installed (run .ci/setup.d/docker-lint.sh): compose file not validated")


@needs_compose
def test_compose_config_validates(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    rv = compose("config", "-q", env={"CONTEXT_API_KEY": "k_test"}, env_file=empty)
    assert rv.returncode == 0, rv.stderr
    for dify in (False, True):
        rv = compose("config", env={"CONTEXT_API_KEY": "k_test"}, env_file=empty, dify=dify)
        assert rv.returncode == 0, rv.stderr
        services = yaml.safe_load(rv.stdout)["services"]
        # (docker-compose 1.x lists a profile's services too; they start only with --profile)
        assert [name for name, svc in services.items() if not svc.get("profiles")] == ["context-mode"]


@needs_compose
def test_the_postgres_override_is_a_primary_a_streaming_standby_and_the_service_on_them(tmp_path):
    """`-f docker-compose.postgres.yml` (issues 18 and 26): PostgreSQL 15 primary and standby, and the service's
    CONTEXT_STORE built from the one variable POSTGRES_PASSWORD. Validated offline (no engine here)."""
    env_file = tmp_path / "pg.env"
    env_file.write_text("CONTEXT_API_KEY=k_test_0123456789abcdef\n")
    config = yaml.safe_load(compose("config", env_file=env_file).stdout)
    assert set(config["services"]) == {"context-mode"}                      # the base file alone: SQLite
    assert config["services"]["context-mode"]["environment"]["CONTEXT_STORE"] == "sqlite"
    rv = compose("config", env_file=env_file, postgres=True)                # the override without its password
    assert rv.returncode != 0 and "POSTGRES_PASSWORD" in rv.stderr
    env_file.write_text(env_file.read_text() + "POSTGRES_PASSWORD=pw0123456789abcdef\n")
    services = yaml.safe_load(compose("config", env_file=env_file, postgres=True).stdout)["services"]
    svc = services["context-mode"]
    assert svc["environment"]["CONTEXT_STORE"] == "postgresql://context:pw0123456789abcdef@postgres-primary:5432/context"
    assert svc["environment"]["CONTEXT_STORE_REPLICA"] == \
        "postgresql://context:pw0123456789abcdef@postgres-standby:5432/context"
    assert float(svc["environment"]["CONTEXT_STORE_WAIT_S"]) >= 60           # waits instead of restart-looping
    assert svc["environment"]["CONTEXT_API_KEYS"].startswith("k_test_")      # the base file's settings stay
    assert set(svc["depends_on"]) == {"postgres-primary", "postgres-standby"}   # stopped before the databases
    primary, standby = services["postgres-primary"], services["postgres-standby"]
    assert primary["image"] == standby["image"] == "postgres:15"
    assert primary["environment"]["POSTGRES_PASSWORD"] == standby["environment"]["POSTGRES_PASSWORD"] != ""
    assert "wal_level=replica" in primary["command"] and standby["user"] == "postgres"
    mounted = [v.split(":")[0] for svc in (primary, standby) for v in svc["volumes"] if v.startswith("/")]
    assert {Path(v).name for v in mounted} == {"primary-init.sh", "standby.sh"}
    assert all(Path(v).is_file() for v in mounted)
    assert "pg_basebackup" in (ROOT / "tools" / "postgres" / "standby.sh").read_text()
    from service.config import Config
    Config.from_env(svc["environment"])                                      # every value one the service takes
    rv = compose("config", "-q", env_file=env_file, postgres=True, dify=True)
    assert rv.returncode == 0, rv.stderr                                     # both overrides together


@needs_compose
def test_without_the_override_nothing_refers_to_difys_network(tmp_path):
    """`docker-compose up -d` failed where Dify is absent: an external network was declared (issue 14)."""
    empty = tmp_path / "empty.env"
    empty.write_text("")
    config = yaml.safe_load(compose("config", env={"CONTEXT_API_KEY": "k_test"}, env_file=empty).stdout)
    assert all(not net.get("external") for net in (config.get("networks") or {}).values())
    joined = yaml.safe_load(compose("config", env={"CONTEXT_API_KEY": "k_test", "DIFY_NETWORK": "dify_net"},
                                    env_file=empty, dify=True).stdout)
    assert joined["networks"]["dify"]["external"] is True and joined["networks"]["dify"]["name"] == "dify_net"
    svc = joined["services"]["context-mode"]
    assert svc["networks"]["dify"]["aliases"] == ["context-mode"] and "default" in svc["networks"]
    assert svc["volumes"] and svc["healthcheck"]["test"][0] == "CMD-SHELL"


@needs_compose
def test_compose_refuses_to_run_without_a_key(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    rv = compose("config", "-q", env_file=empty)
    assert rv.returncode != 0 and "CONTEXT_API_KEY" in rv.stderr


@needs_compose
def test_env_example_works_with_compose():
    rv = compose("config", env_file=ROOT / ".env.example")
    assert rv.returncode == 0, rv.stderr
    config = yaml.safe_load(rv.stdout)
    env = config["services"]["context-mode"]["environment"]
    assert env["CONTEXT_API_KEYS"] == "change-me:default:push+search"
    # ... which the service refuses with a message saying so (issue 26): a copied example never runs.
    from service import preflight
    with pytest.raises(preflight.Refused, match="placeholder"):
        preflight.check({k: str(v) for k, v in env.items()}, wait=False)
    assert "CONTEXT_MCP_ALLOWED_HOSTS" not in (ROOT / ".env.example").read_text()     # the current name only
    rv = compose("config", env_file=ROOT / ".env.example", dify=True)
    assert rv.returncode == 0, rv.stderr
    assert yaml.safe_load(rv.stdout)["networks"]["dify"]["name"] == "docker_default"


@needs_compose
def test_an_admin_key_is_one_setting_away(tmp_path):
    env_file = tmp_path / "admin.env"
    env_file.write_text("CONTEXT_API_KEY=cms_admin-1-0123456789abcdef\nCONTEXT_API_SCOPES=push+search+admin\n")
    rv = compose("config", env_file=env_file)
    assert rv.returncode == 0, rv.stderr
    from service.auth import KeyRing
    from service.config import Config
    value = yaml.safe_load(rv.stdout)["services"]["context-mode"]["environment"]["CONTEXT_API_KEYS"]
    principal = KeyRing.from_config(Config(api_keys=value)).authenticate("cms_admin-1-0123456789abcdef")
    assert principal.scopes == {"push", "search", "admin"}


# --- Dockerfile structure -----------------------------------------------------------------------
def test_dockerfile_structure():
    assert INSTR[0] == ("FROM", "python:3.11-slim")
    users = [args for word, args in INSTR if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "must end as a non-root user"
    env = " ".join(args for word, args in INSTR if word == "ENV")
    assert "CONTEXT_DATA_DIR=/data" in env and "CONTEXT_BIND=0.0.0.0:5000" in env
    runs = " ".join(args for word, args in INSTR if word == "RUN")
    assert "jieba.initialize()" in runs, "the jieba dictionary cache is warmed at build"
    assert "pip install" in runs and "clients/python" in runs
    # The warm-up runs as the runtime user, so the cache file it writes is readable at run time.
    words = [w for w, _ in INSTR]
    assert words.index("USER") < max(i for i, (w, a) in enumerate(INSTR) if w == "RUN" and "jieba" in a)


def healthcheck_command() -> list[str]:
    """The image's HEALTHCHECK as the engine runs it: shell form, i.e. CMD-SHELL (``sh -c``)."""
    health = [a for w, a in INSTR if w == "HEALTHCHECK"][0]
    line = health[health.index("CMD") + 3:].strip()
    assert not line.startswith("["), "shell form: podman's Docker API splits exec-form arguments on spaces"
    return ["sh", "-c", line]


def test_code_is_owned_by_root_and_only_data_by_the_app_user():
    """COPY --chown=app let the runtime user rewrite the code (issue 14)."""
    for word, args in INSTR:
        if word in ("COPY", "ADD"):
            assert "--chown" not in args, args
    runs = " ".join(args for word, args in INSTR if word == "RUN")
    assert re.findall(r"chown\s+\S+\s+(\S+)", runs) == ["/data"]
    # ... and only by it: the service warned at every start that group and other could read /data (issue 26)
    assert re.findall(r"chmod\s+(\S+)\s+(\S+)", runs) == [("0700", "/data")]


def test_dockerfile_healthcheck_and_cmd():
    health = [args for word, args in INSTR if word == "HEALTHCHECK"]
    assert len(health) == 1
    assert "CMD" in health[0] and "python" in health[0] and "/healthz" in health[0]
    assert "curl" not in health[0] and "wget" not in health[0]
    cmd = [args for word, args in INSTR if word == "CMD"][-1]
    line = exec_form(cmd)[-1]
    assert re.search(r"exec gunicorn -c service/gunicorn_conf.py 'service:create_app\(\)'$", line), line


def test_dockerfile_copies_only_what_exists_and_is_not_ignored():
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    for p in (".git", ".venv", "data", ".env", "tests"):
        assert p in ignored
    for word, args in INSTR:
        if word == "COPY":
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for src in sources:
                assert (ROOT / src).exists(), src
                assert src.rstrip("/") not in ignored, src


# --- compose structure --------------------------------------------------------------------------
def test_compose_structure():
    services = COMPOSE["services"]
    # the service alone; PostgreSQL's primary and standby come with docker-compose.postgres.yml
    assert set(services) == {"context-mode"}
    assert set(PG_OVERRIDE["services"]) == {"context-mode", "postgres-primary", "postgres-standby"}
    svc = services["context-mode"]
    assert "context-data:/data" in svc["volumes"]
    hc = svc["healthcheck"]
    assert hc["test"][0] == "CMD-SHELL" and len(hc["test"]) == 2 and "/healthz" in hc["test"][1]
    assert "${CONTEXT_API_KEY:?" in svc["environment"]["CONTEXT_API_KEYS"]
    assert svc["environment"]["CONTEXT_DATA_DIR"] == "/data"
    assert "context-data" in COMPOSE["volumes"]                           # a named volume, not a bind mount
    assert "profiles" not in svc and "networks" not in COMPOSE
    joined = DIFY_OVERRIDE["services"]["context-mode"]
    assert joined["networks"]["dify"]["aliases"] == ["context-mode"]
    assert DIFY_OVERRIDE["networks"]["dify"]["external"] is True


def test_api_keys_format_matches_the_service(tmp_path):
    """The compose value "<key>:<tenant>:push+search" is what service/auth.py parses."""
    from service.auth import KeyRing
    from service.config import Config
    value = COMPOSE["services"]["context-mode"]["environment"]["CONTEXT_API_KEYS"]
    value = re.sub(r"\$\{CONTEXT_API_KEY:\?[^}]*\}", "cms_abc-123-0123456789abcdef", value)
    value = value.replace("${CONTEXT_TENANT:-default}", "acme").replace("${CONTEXT_API_SCOPES:-push+search}",
                                                                       "push+search")
    principal = KeyRing.from_config(Config(api_keys=value)).authenticate("cms_abc-123-0123456789abcdef")
    assert principal is not None and principal.tenant == "acme" and principal.scopes == {"push", "search"}


# --- the image's commands, run here for real -----------------------------------------------------
def test_cmd_execs_gunicorn_and_healthcheck_works(tmp_path):
    """Run the Dockerfile's CMD (sh -c '... && exec gunicorn ...') and HEALTHCHECK outside Docker."""
    port = free_port()
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
               CONTEXT_DATA_DIR=str(tmp_path / "data"), CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_WORKERS="1")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cmd = exec_form([a for w, a in INSTR if w == "CMD"][-1])
    health_cmd = healthcheck_command()
    compose_health = COMPOSE["services"]["context-mode"]["healthcheck"]["test"]
    compose_cmd = ["sh", "-c", compose_health[1].replace("127.0.0.1:5000", f"127.0.0.1:{port}")]
    log = open(tmp_path / "cmd.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "cmd.log").read_text()
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        else:
            pytest.fail("the CMD did not serve /healthz: " + (tmp_path / "cmd.log").read_text()[-2000:])
        # exec replaced the shell: the PID the container would start is gunicorn's master.
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert any(b"gunicorn" in part for part in cmdline), cmdline
        rv = subprocess.run(health_cmd, env=env, timeout=30)
        assert rv.returncode == 0
        assert subprocess.run(compose_cmd, env=env, timeout=30).returncode == 0
        dead = dict(env, CONTEXT_BIND=f"127.0.0.1:{free_port()}")
        assert subprocess.run(health_cmd, env=dead, capture_output=True, timeout=30).returncode != 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def test_setup_script_is_idempotent_and_says_what_it_installs():
    script = (ROOT / ".ci" / "setup.d" / "docker-lint.sh").read_text()
    assert "command -v docker-compose" in script and "command -v hadolint" in script
    assert "set -euo pipefail" in script
    if HADOLINT and DOCKER_COMPOSE:
        rv = subprocess.run(["bash", str(ROOT / ".ci" / "setup.d" / "docker-lint.sh")], capture_output=True,
                            text=True, timeout=60)
        assert rv.returncode == 0, rv.stderr
        assert "1." in rv.stdout and "dockerfile linter" in rv.stdout.lower()


def test_shlex_sanity_of_cmd():
    # The CMD's shell line must parse (no stray quotes) the way sh will read it.
    line = exec_form([a for w, a in INSTR if w == "CMD"][-1])[-1]
    words = shlex.split(line)
    assert words[-4:] == ["gunicorn", "-c", "service/gunicorn_conf.py", "service:create_app()"]
