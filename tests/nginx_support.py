"""tools/nginx/nginx.conf (the compose file's proxy) run for real on loopback: Debian's nginx as a foreground
process with a temporary prefix, pid and temporary files, in front of gunicorns on free ports."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from conftest import ROOT, free_port, stop_group

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
NO_NGINX = "nginx is not installed (run .ci/setup.d/nginx.sh): the attacks through the compose file's proxy are not run"
CONF = ROOT / "tools" / "nginx" / "nginx.conf"
NODES = ROOT / "tools" / "nginx" / "nodes.conf"
NODES_POSTGRES = ROOT / "tools" / "nginx" / "nodes-postgres.conf"
TLS = ROOT / "tools" / "nginx" / "tls.conf"


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, f"tools/nginx: {old!r} not found: the tests' rendering must follow the config"
    return text.replace(old, new)


def render(directory: Path, port: int, node_ports: list[int], *, nodes: Path = NODES,
           settings: dict[str, str] | None = None, tls: tuple[int, Path] | None = None) -> Path:
    """nginx.conf as compose runs it, but listening on 127.0.0.1:``port``, its nodes on ``node_ports`` of
    loopback (in ``nodes``' order), its files under ``directory``, and ``settings`` (e.g. shorter timeouts).
    ``tls``: (port, folder of fullchain.pem and privkey.pem): tls.conf mounted as docker-compose.tls.yml does."""
    directory.mkdir(parents=True, exist_ok=True)
    text = _replace(CONF.read_text(), "listen 5000;", f"listen 127.0.0.1:{port};")
    text = _replace(text, "/tmp/", f"{directory}/")
    text = _replace(text, "include /etc/nginx/context-mode-nodes.conf;", f"include {directory}/nodes.conf;")
    tls_text = ""
    if tls is not None:
        tls_text = _replace(TLS.read_text(), "listen 5443 ssl;", f"listen 127.0.0.1:{tls[0]} ssl;")
        tls_text = _replace(tls_text, "/etc/nginx/tls/", f"{tls[1]}/")
    (directory / "tls").mkdir(exist_ok=True)
    (directory / "tls" / "context-mode-tls.conf").write_text(tls_text)
    text = _replace(text, "include /etc/nginx/context-mode-tls*.conf;", f"include {directory}/tls/context-mode-tls*.conf;")
    for name, value in (settings or {}).items():
        text, n = re.subn(rf"(?m)^(\s*){name} \S+;", rf"\g<1>{name} {value};", text)
        assert n == 1, f"tools/nginx/nginx.conf sets {name} once"
    if os.geteuid() == 0:
        text = "user root;\n" + text     # (its workers would be nobody, who cannot enter this directory)
    upstream = nodes.read_text()
    names = re.findall(r"server (\S+):5000;", upstream)
    assert len(names) == len(node_ports), (names, node_ports)
    for name, node_port in zip(names, node_ports):
        upstream = _replace(upstream, f"server {name}:5000;", f"server 127.0.0.1:{node_port};")
    (directory / "nodes.conf").write_text(upstream)
    path = directory / "nginx.conf"
    path.write_text(text)
    return path


class Nginx:
    """nginx with tools/nginx/nginx.conf in front of gunicorns on loopback (``url`` is where it listens)."""

    def __init__(self, directory: Path, node_ports: list[int], *, tls_dir: Path | None = None, **kw):
        self.directory = Path(directory)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tls_port = free_port() if tls_dir is not None else None
        self.tls_url = f"https://127.0.0.1:{self.tls_port}" if tls_dir is not None else None
        tls = (self.tls_port, Path(tls_dir)) if tls_dir is not None else None
        self.conf = render(self.directory, self.port, node_ports, tls=tls, **kw)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> "Nginx":
        self._log = open(self.directory / "nginx.log", "ab")
        self.proc = subprocess.Popen([NGINX, "-e", "stderr", "-p", str(self.directory), "-c", str(self.conf)],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nginx did not listen:\n{self.log()}")

    def log(self) -> str:
        return (self.directory / "nginx.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, signal.SIGQUIT, 10)        # graceful: workers finish what they hold
        if getattr(self, "_log", None):
            self._log.close()
