"""Dockerfile and docker-compose.yml, checked without a Docker engine (none exists here).

Run when installed (.ci/setup.d/docker-lint.sh installs both): hadolint on the Dockerfiles and
Debian's docker-compose v1 `config`, which parses, interpolates and validates offline. Always:
structural assertions, and the image's HEALTHCHECK and CMD commands run for real against a local
gunicorn; with nginx installed (.ci/setup.d/nginx.sh), the proxy's config (tools/nginx/) balancing two
real nodes on one PostgreSQL store. Not run: `docker build` and starting containers.
"""
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from conftest import ROOT, LiveServer, free_port, stop_group, wait_healthy
from nginx_support import CONF as NGINX_CONF
from nginx_support import NGINX, NO_NGINX, NODES, NODES_POSTGRES, Nginx

DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE_PATH = ROOT / "docker-compose.yml"
COMPOSE = yaml.safe_load(COMPOSE_PATH.read_text())
DIFY_OVERRIDE_PATH = ROOT / "docker-compose.dify.yml"
DIFY_OVERRIDE = yaml.safe_load(DIFY_OVERRIDE_PATH.read_text())
PG_OVERRIDE_PATH = ROOT / "docker-compose.postgres.yml"
PG_OVERRIDE = yaml.safe_load(PG_OVERRIDE_PATH.read_text())
TLS_OVERRIDE_PATH = ROOT / "docker-compose.tls.yml"
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
@pytest.mark.parametrize("dockerfile", ["Dockerfile", "tools/nginx/Dockerfile"])
def test_hadolint_passes(dockerfile):
    rv = subprocess.run([HADOLINT, "--no-color", str(ROOT / dockerfile)], capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stdout + rv.stderr


def compose(*args, env=None, env_file=None, dify=False, postgres=False, tls=False):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONTEXT_", "DIFY_", "COMPOSE_", "POSTGRES_"))}
    environ.update(env or {})
    cmd = [DOCKER_COMPOSE, "--project-directory", str(ROOT), "-f", str(COMPOSE_PATH)]
    if dify:
        cmd += ["-f", str(DIFY_OVERRIDE_PATH)]
    if postgres:
        cmd += ["-f", str(PG_OVERRIDE_PATH)]
    if tls:
        cmd += ["-f", str(TLS_OVERRIDE_PATH)]
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
        assert [name for name, svc in services.items() if not svc.get("profiles")] == ["context-mode", "proxy"]


@needs_compose
def test_the_postgres_override_is_a_primary_a_streaming_standby_and_the_service_on_them(tmp_path):
    """`-f docker-compose.postgres.yml` (issues 18 and 26): PostgreSQL 15 primary and standby, and the service's
    CONTEXT_STORE built from the one variable POSTGRES_PASSWORD. Validated offline (no engine here)."""
    env_file = tmp_path / "pg.env"
    env_file.write_text("CONTEXT_API_KEY=k_test_0123456789abcdef\n")
    config = yaml.safe_load(compose("config", env_file=env_file).stdout)
    assert set(config["services"]) == {"context-mode", "proxy"}             # the base file alone: SQLite
    assert config["services"]["context-mode"]["environment"]["CONTEXT_STORE"] == "sqlite"
    rv = compose("config", env_file=env_file, postgres=True)                # the override without its password
    assert rv.returncode != 0 and "POSTGRES_PASSWORD" in rv.stderr
    env_file.write_text(env_file.read_text() + "POSTGRES_PASSWORD=pw0123456789abcdef\n")
    rv = compose("config", env_file=env_file, postgres=True)                # ... or the nodes' shared cursor key
    assert rv.returncode != 0 and "CONTEXT_MCP_CURSOR_SECRET" in rv.stderr
    env_file.write_text(env_file.read_text() + "CONTEXT_MCP_CURSOR_SECRET=cursor0123456789abcdef\n")
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
    # Two nodes on that store (issue 24): the same image and settings, a data directory each, behind the proxy.
    node2 = services["context-mode-2"]
    assert node2["environment"] == svc["environment"] and node2["image"] == svc["image"]
    assert svc["environment"]["CONTEXT_MCP_CURSOR_SECRET"] == "cursor0123456789abcdef"   # cursors valid on both
    assert [v.split(":")[1] for v in svc["volumes"]] == [v.split(":")[1] for v in node2["volumes"]] == ["/data"]
    assert svc["volumes"][0].split(":")[0] != node2["volumes"][0].split(":")[0]
    assert set(node2["depends_on"]) == {"postgres-primary", "postgres-standby"} and "ports" not in node2
    proxy = services["proxy"]
    assert set(proxy["depends_on"]) == {"context-mode", "context-mode-2"}
    mounted = {v.split(":")[1]: v.split(":")[0] for v in proxy["volumes"]}
    assert Path(mounted["/etc/nginx/context-mode-nodes.conf"]) == NODES_POSTGRES
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
    # Dify reaches the service through the proxy (issue 25: not gunicorn directly), by the name it documents
    proxy = joined["services"]["proxy"]
    assert proxy["networks"]["dify"]["aliases"] == ["context-mode"] and "default" in proxy["networks"]
    assert "dify" not in (joined["services"]["context-mode"].get("networks") or {})
    svc = joined["services"]["context-mode"]
    assert svc["volumes"] and svc["healthcheck"]["test"][0] == "CMD-SHELL"


@needs_compose
def test_compose_refuses_to_run_without_a_key(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    rv = compose("config", "-q", env_file=empty)
    assert rv.returncode != 0 and "CONTEXT_API_KEY" in rv.stderr


def test_compose_files_pass_only_the_current_allow_list_names():
    """Every guide says CONTEXT_ALLOWED_HOSTS; the compose files passed the older CONTEXT_MCP_ALLOWED_HOSTS too,
    which made a newcomer wonder which one counts."""
    for path in ROOT.glob("docker-compose*.yml"):
        assert "CONTEXT_MCP_ALLOWED" not in path.read_text(encoding="utf-8"), path.name


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
    # the service and its proxy; PostgreSQL's primary and standby and a second node come with docker-compose.postgres.yml
    assert set(services) == {"context-mode", "proxy"}
    assert set(PG_OVERRIDE["services"]) == {"context-mode", "context-mode-2", "proxy", "postgres-primary",
                                            "postgres-standby"}
    svc = services["context-mode"]
    assert "context-data:/data" in svc["volumes"]
    hc = svc["healthcheck"]
    assert hc["test"][0] == "CMD-SHELL" and len(hc["test"]) == 2 and "/healthz" in hc["test"][1]
    assert "${CONTEXT_API_KEY:?" in svc["environment"]["CONTEXT_API_KEYS"]
    assert svc["environment"]["CONTEXT_DATA_DIR"] == "/data"
    assert "context-data" in COMPOSE["volumes"]                           # a named volume, not a bind mount
    assert "profiles" not in svc and "networks" not in COMPOSE
    joined = DIFY_OVERRIDE["services"]["proxy"]            # Dify reaches the proxy, not gunicorn
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


# --- the proxy (tools/nginx/) ------------------------------------------------------------------------
def nginx_directives(text: str) -> dict[str, list[str]]:
    """Each directive's values (comments dropped), in the order they appear."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.endswith(";"):
            name, _, value = line[:-1].partition(" ")
            found.setdefault(name, []).append(value.strip())
    return found


def nginx_size(value: str) -> int:
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    return int(value[:-1]) * units[value[-1].lower()] if value[-1].lower() in units else int(value)


def nginx_seconds(value: str) -> float:
    return float(value[:-1]) * {"s": 1, "m": 60}[value[-1]] if value[-1] in "sm" else float(value)


def test_the_proxy_fronts_gunicorn_with_the_services_limits():
    """Only the proxy is published; it buffers requests and responses, and its limits are the service's
    defaults (service/config.py, service/gunicorn_conf.py, the guard's memory buffer)."""
    from service.config import Config
    from service.guard.responses import PREBUFFER_BYTES
    services = COMPOSE["services"]
    assert "ports" not in services["context-mode"] and services["context-mode"]["expose"] == ["5000"]
    proxy = services["proxy"]
    assert proxy["ports"] == ["${CONTEXT_HOST_BIND:-127.0.0.1}:${CONTEXT_PORT:-5000}:5000"]
    assert proxy["build"] == "./tools/nginx" and proxy["depends_on"] == ["context-mode"]
    assert proxy["healthcheck"]["test"][0] == "CMD-SHELL" and "/healthz" in proxy["healthcheck"]["test"][1]
    d = nginx_directives(NGINX_CONF.read_text())
    config = Config()
    gunicorn_conf = (ROOT / "service" / "gunicorn_conf.py").read_text()
    setting = {m[0]: int(m[1]) for m in re.findall(r"^(\w+) = (\d+)", gunicorn_conf, re.M)}
    assert d["proxy_request_buffering"] == ["on"] and d["proxy_buffering"] == ["on"]
    assert nginx_size(d["client_max_body_size"][0]) == config.max_body_bytes          # the largest route's (/mcp/push)
    assert nginx_size(d["client_body_buffer_size"][0]) == PREBUFFER_BYTES
    for name in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        assert nginx_seconds(d[name][0]) == config.read_timeout_s, name
    count, size = d["large_client_header_buffers"][0].split()
    assert nginx_size(size) == setting["limit_request_field_size"] >= setting["limit_request_line"]
    assert nginx_seconds(d["keepalive_timeout"][0]) == setting["keepalive"]
    assert nginx_seconds(d["proxy_read_timeout"][0]) > setting["timeout"]
    assert d["proxy_set_header"][:2] == ['Connection ""', "Host $http_host"]
    assert d["include"] == ["/etc/nginx/context-mode-nodes.conf", "/etc/nginx/context-mode-tls*.conf"]
    assert d["daemon"] == ["off"]
    for nodes, names in ((NODES, ["context-mode:5000"]), (NODES_POSTGRES, ["context-mode:5000", "context-mode-2:5000"])):
        upstream = nginx_directives(nodes.read_text())
        assert upstream["server"] == names                   # the balancer lists every node of its compose file
        assert nginx_seconds(upstream["keepalive_timeout"][0]) < setting["keepalive"]
    image = instructions((ROOT / "tools" / "nginx" / "Dockerfile").read_text())
    assert image[0] == ("FROM", "python:3.11-slim")           # the one base podman stands in for here
    assert [a for w, a in image if w == "USER"] == ["33:33"]  # www-data, not root
    copied = {a.split()[-1]: a.split()[0] for w, a in image if w == "COPY"}
    assert copied == {"/etc/nginx/nginx.conf": "nginx.conf", "/etc/nginx/context-mode-nodes.conf": "nodes.conf"}
    assert exec_form([a for w, a in image if w == "CMD"][-1])[0] == "nginx"


@pytest.mark.skipif(NGINX is None, reason=NO_NGINX)
def test_the_postgres_override_balances_two_nodes_on_one_store(tmp_path, pg_urls):
    """tools/nginx/nodes-postgres.conf for real: two gunicorns on one PostgreSQL store behind nginx. Pushes
    through the proxy land on both nodes, and each node finds all of them (several nodes, one store)."""
    key = "acme-two-nodes-0123456789"
    primary, standby = pg_urls
    env = {"CONTEXT_STORE": primary, "CONTEXT_STORE_REPLICA": standby, "CONTEXT_MCP_CURSOR_SECRET": "s" * 32}
    for i in (1, 2):
        (tmp_path / f"node{i}").mkdir()
    nodes = [LiveServer(tmp_path / f"node{i}" / "data", workers=1, keys={key: ("acme", ("push", "search"))},
                        env=env) for i in (1, 2)]
    nginx = None
    try:
        for node in nodes:
            node.start()
        nginx = Nginx(tmp_path / "nginx", [n.port for n in nodes], nodes=NODES_POSTGRES).start()
        headers = {"Authorization": f"Bearer {key}"}
        for i in range(12):
            rv = requests.post(nginx.url + "/mcp/push", json={"type": "tool_output", "source": "two_nodes",
                                                               "timestamp": int(time.time()), "ttl": 3600,
                                                               "content": f"balanced unit {i}"},
                               headers=headers, timeout=30)
            assert rv.status_code == 200, rv.text
        deadline = time.monotonic() + 10     # (access lines are written in batches, at most 50 ms late)
        while sum(pushes := [n.log(tail=None).count("route=/mcp/push status=200") for n in nodes]) < 12 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(pushes) and sum(pushes) == 12, pushes                    # both nodes took pushes
        for url in [n.url for n in nodes] + [nginx.url] * 2:
            rv = requests.get(url + "/mcp/units?limit=50&source=two_nodes", headers=headers, timeout=30)
            assert len(rv.json()["units"]) == 12                            # ... into the one store
        page = requests.get(nginx.url + "/mcp/units?limit=5&source=two_nodes", headers=headers, timeout=30).json()
        for n in nodes:                                                     # a cursor one node made, on either
            rv = requests.get(n.url + f"/mcp/units?limit=5&source=two_nodes&cursor={page['next_cursor']}",
                              headers=headers, timeout=30)
            assert rv.status_code == 200 and len(rv.json()["units"]) == 5, rv.text
    finally:
        if nginx:
            nginx.stop()
        for node in nodes:
            node.stop()


# --- the image's commands, run here for real -----------------------------------------------------
@needs_compose
def test_the_tls_override_adds_a_tls_server_to_the_proxy(tmp_path):
    """docker-compose.tls.yml (docs/tls.md): the proxy publishes its TLS server too, with tls.conf and the
    certificate folder mounted read-only; nothing else changes."""
    empty = tmp_path / "empty.env"
    empty.write_text("")
    rv = compose("config", env={"CONTEXT_API_KEY": "k_test", "CONTEXT_TLS_DIR": str(tmp_path / "certs")},
                 env_file=empty, tls=True)
    assert rv.returncode == 0, rv.stderr
    services = yaml.safe_load(rv.stdout)["services"]
    proxy = services["proxy"]
    published = [(str(p.get("published")), str(p.get("target"))) if isinstance(p, dict) else tuple(p.split(":")[-2:])
                 for p in proxy["ports"]]
    published = [(host, target.split("/")[0]) for host, target in published]         # (compose 1.x: "5443/tcp")
    assert ("443", "5443") in published and ("5000", "5000") in published
    mounts = {(v["target"], v.get("read_only")) if isinstance(v, dict) else (v.split(":")[1], v.endswith(":ro"))
              for v in proxy["volumes"]}
    assert mounts == {("/etc/nginx/context-mode-tls.conf", True), ("/etc/nginx/tls", True)}
    assert services["context-mode"] == yaml.safe_load(compose("config", env={"CONTEXT_API_KEY": "k_test"},
                                                               env_file=empty).stdout)["services"]["context-mode"]


def _self_signed(folder: Path) -> Path:
    """A certificate for 127.0.0.1 and localhost, and its key, as docs/tls.md names them."""
    folder.mkdir(parents=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(folder / "privkey.pem"), "-out", str(folder / "fullchain.pem")],
                   check=True, capture_output=True, timeout=60)
    return folder / "fullchain.pem"


@pytest.mark.skipif(NGINX is None or shutil.which("openssl") is None, reason=NO_NGINX + " (or openssl)")
def test_the_tls_server_serves_the_service_with_the_plain_servers_limits(tmp_path):
    """tools/nginx/tls.conf beside nginx.conf, as the override mounts them, in front of a real gunicorn: a push
    and a search over TLS (the certificate checked), HSTS on the answers, and the same body limit as the plain
    server (its settings are the http block's)."""
    import ssl
    cert = _self_signed(tmp_path / "certs")
    server = LiveServer(tmp_path / "data", workers=1).start()
    proxy = Nginx(tmp_path / "nginx", [server.port], tls_dir=tmp_path / "certs").start()
    try:
        rv = requests.post(proxy.tls_url + "/mcp/push", json={"type": "tool_output", "source": "tls_check",
                                                              "content": "shipped over TLS 经由 TLS"},
                           verify=str(cert), timeout=30)
        assert rv.status_code == 200, rv.text
        assert rv.headers["Strict-Transport-Security"] == "max-age=31536000"
        found = requests.get(proxy.tls_url + "/mcp/search?q=TLS&consistency=strong", verify=str(cert), timeout=30)
        assert [r["source"] for r in found.json()["results"]] == ["tls_check"]
        assert requests.get(proxy.url + "/healthz", timeout=30).status_code == 200       # the plain server stays
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(proxy.tls_url + "/healthz", timeout=30)                          # an unknown CA: refused
        context = ssl.create_default_context(cafile=str(cert))
        with socket.create_connection(("127.0.0.1", proxy.tls_port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
        big = requests.post(proxy.tls_url + "/mcp/push", data=b"x" * (33 << 20), verify=str(cert), timeout=60,
                            headers={"Content-Type": "application/json"})
        assert big.status_code == 413                                   # client_max_body_size, as on port 5000
    finally:
        proxy.stop()
        server.stop()


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
        wait_healthy(proc, f"http://127.0.0.1:{port}", 60, lambda: (tmp_path / "cmd.log").read_text()[-2000:])
        # exec replaced the shell: the PID the container would start is gunicorn's master.
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert any(b"gunicorn" in part for part in cmdline), cmdline
        rv = subprocess.run(health_cmd, env=env, timeout=30)
        assert rv.returncode == 0
        assert subprocess.run(compose_cmd, env=env, timeout=30).returncode == 0
        dead = dict(env, CONTEXT_BIND=f"127.0.0.1:{free_port()}")
        assert subprocess.run(health_cmd, env=dead, capture_output=True, timeout=30).returncode != 0
    finally:
        stop_group(proc)
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


def test_the_nginx_setup_script_is_idempotent():
    script = ROOT / ".ci" / "setup.d" / "nginx.sh"
    text = script.read_text()
    assert "set -euo pipefail" in text and "command -v nginx" in text and "apt-get install" in text
    if NGINX:
        rv = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
        assert rv.returncode == 0 and "nginx already installed" in rv.stdout, rv.stdout + rv.stderr
