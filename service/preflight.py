"""Whether a start can work, decided once before anything forks.

gunicorn's master (service/gunicorn_conf.py), `context-mode serve` and `context-mode doctor` ask here,
so a refused configuration (a bad keys file, no keys on a public bind, an unknown CONTEXT_STORE, a
value that is not a number) ends the start with one line and a non-zero exit, instead of the same
traceback from every worker and a restart loop. The workers' create_app() still checks the same
things: an app built without gunicorn (tests, embedding) refuses the same configurations.
"""
from __future__ import annotations

import time

from .auth import KeyRing
from .budget import Budget
from .config import Config
from .doors import refuse_open_bind, refuse_shared_origins
from .ratelimit import rate_limits
from .store import check_backend, store_problem


class Refused(Exception):
    """A configuration this service will not start with; the message is one line for the operator."""


def check(environ: dict | None = None, *, wait: bool = True, log=None, **overrides) -> Config:
    """The configuration read from the environment (and ``overrides``, e.g. serve's --bind), or Refused
    saying why the start cannot work.
    :param wait: wait up to CONTEXT_STORE_WAIT_S for a PostgreSQL primary that does not answer yet."""
    try:
        config = Config.from_env(environ, **overrides)
    except ValueError as e:
        raise Refused(str(e)) from None
    try:
        keys = KeyRing.from_config(config)
    except OSError as e:
        raise Refused(f"CONTEXT_API_KEYS_FILE={config.api_keys_file}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise Refused(str(e)) from None
    try:
        refuse_open_bind(config, keys)
        refuse_shared_origins(config, keys)
        check_backend(config)
    except RuntimeError as e:
        raise Refused(str(e)) from None
    try:
        rate_limits(config, keys)
    except ValueError as e:
        raise Refused(str(e)) from None
    if wait:
        problem = wait_for_store(config, log=log)
        if problem:
            raise Refused(problem)
    return config


def check_listeners(config: Config, addresses) -> None:
    """Refused when no keys are configured and gunicorn listens on an address that is not loopback,
    whatever named it (CONTEXT_BIND, -b, GUNICORN_CMD_ARGS="--bind ...", inherited sockets).
    :param addresses: what gunicorn binds or has bound: (host, port[, ...]) tuples, unix socket paths, fds."""
    if config.allow_open or not KeyRing.from_config(config).open:
        return
    public = [shown for shown in map(_public_address, addresses) if shown]
    if public:
        raise Refused(
            f"No API keys are configured and gunicorn listens on {', '.join(public)}, which is not loopback "
            "(set by CONTEXT_BIND, --bind or GUNICORN_CMD_ARGS), so anyone who can reach it could read and write "
            "everything. Configure keys (CONTEXT_API_KEYS_FILE, see `context-mode keys add`), bind 127.0.0.1, "
            "or set CONTEXT_ALLOW_OPEN=1 if a proxy in front authenticates callers.")


def _public_address(address) -> str | None:
    """``host:port`` of an address that is not loopback, else None (unix sockets are local; an fd is
    checked once gunicorn has bound it)."""
    import ipaddress
    if not isinstance(address, tuple) or len(address) < 2:
        return None
    host = str(address[0]).strip("[]").lower()
    if host == "localhost":
        return None
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        if ip.is_loopback:
            return None
    except ValueError:
        pass                                   # a name (or "": every interface) may be any interface
    shown = f"[{host}]" if ":" in host else (host or "*")
    return f"{shown}:{address[1]}"


def wait_for_store(config: Config, *, log=None, sleep=time.sleep) -> str | None:
    """Wait up to ``config.store_wait_s`` for the primary (compose starts the database beside the
    service: waiting beats a restart loop); None once it answers, else why not."""
    deadline = time.monotonic() + config.store_wait_s
    told = False
    while True:
        problem = store_problem(config)
        if problem is None or time.monotonic() >= deadline:
            return problem and (problem + (f" (waited {config.store_wait_s:g} s, CONTEXT_STORE_WAIT_S)"
                                           if config.store_wait_s else ""))
        if log and not told:
            log(f"waiting up to {config.store_wait_s:g} s for the database: {problem}")
            told = True
        sleep(1.0)


def warnings(config: Config) -> list[str]:
    """What works but should be changed (said once at start, and by `context-mode doctor`)."""
    found = []
    for old, new in (("mcp_allowed_hosts", "CONTEXT_ALLOWED_HOSTS"), ("mcp_allowed_origins", "CONTEXT_ALLOWED_ORIGINS")):
        if getattr(config, old):
            found.append(f"CONTEXT_{old.upper()} is the older name of {new} (still added to it); rename it")
    # an open-files limit too low for the configuration: what each process will keep open (service/budget.py)
    found += Budget.of(config).warnings(config)
    return found
