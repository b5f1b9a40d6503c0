"""`context-mode` command line: run (gunicorn), serve, doctor, keys, install / uninstall <agent> (``install.py``); the stores' backup and restore, the MCP stdio bridge
(``stdio.py``), and the client commands when the Python client is installed (``client.py``: push, search, import;
``manage.py``: list, stats, export, forget; their settings: ``env.py``)."""
from __future__ import annotations

import os
import sys
import tempfile

import click

from ..config import Config
from ..store import register_cli
from . import install, stdio


@click.group()
def main():
    """Context Mode Service."""
    # What a command writes is the memory itself (backup, restore, export) or keys: private to this user, as the
    # live store is (0600 files, 0700 folders; create_app sets the same for the service).
    os.umask(0o077)


def _streams_summary(config) -> str:
    """How many live streams (MCP subscriptions, /mcp/stream) the server holds open: each holds a thread."""
    cap = config.stream_cap
    line = (f"live streams: {cap} per worker x {config.workers} workers = {cap * config.workers} "
            f"(CONTEXT_MAX_STREAMS of CONTEXT_THREADS {config.threads})")
    if config.keyless:
        return line + "; no keys: the one tenant may hold them all"
    return line + "; a tenant at most half a worker's unless CONTEXT_STREAM_SHARE says otherwise"


def platform_data_dir() -> str:
    """Where an installed service keeps its data when CONTEXT_DATA_DIR names nowhere: the platform's folder for a
    user's application data (XDG_DATA_HOME or ~/.local/share; macOS Application Support; Windows LOCALAPPDATA)."""
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        base = os.path.join(home, "Library", "Application Support")
    elif os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
    else:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(base, "context-mode")


@main.command()
@click.option("--bind", default=None, help="host:port (default: CONTEXT_BIND or 127.0.0.1:5000)")
@click.option("--data-dir", default=None, help="the SQLite data folder (default: CONTEXT_DATA_DIR, else the "
              "platform's data folder, e.g. ~/.local/share/context-mode)")
@click.pass_context
def run(ctx, bind, data_dir):
    """Run the service under gunicorn with its shipped configuration (what `make run` runs), from wherever it
    is installed."""
    if bind:
        os.environ["CONTEXT_BIND"] = bind
    if data_dir or not os.environ.get("CONTEXT_DATA_DIR"):
        os.environ["CONTEXT_DATA_DIR"] = data_dir or platform_data_dir()
    ctx.invoke(doctor, quiet=True)            # what gunicorn's master would refuse, said in one line first
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gunicorn_conf.py")
    click.echo(f"context-mode: data in {os.path.abspath(os.environ['CONTEXT_DATA_DIR'])}", err=True)
    os.execv(sys.executable, [sys.executable, "-m", "gunicorn", "-c", conf, "service:create_app()"])


@main.command()
@click.option("--bind", default=None, help="host:port (default: CONTEXT_BIND or 127.0.0.1:5000)")
def serve(bind):
    """Run the development server (use `make run` for gunicorn)."""
    from .. import create_app, preflight
    try:
        config = preflight.check(log=lambda line: click.echo(line, err=True), **({"bind": bind} if bind else {}))
    except preflight.Refused as e:
        raise click.ClickException(f"refusing to start: {e}") from None
    for warning in preflight.warnings(config):
        click.echo(f"warning: {warning}", err=True)
    host, _, port = config.bind.rpartition(":")
    app = create_app(config)
    app.run(host=host or "127.0.0.1", port=int(port), threaded=True, use_reloader=False)


@main.command()
@click.option("--quiet", is_flag=True, help="Print only problems.")
def doctor(quiet):
    """Check the configuration and keys, the storage backend, the data directory and the jieba dictionary."""
    from .. import preflight
    from ..store import doctor_lines
    ok = True

    def report(good: bool, text: str):
        nonlocal ok
        ok = ok and good
        if not good or not quiet:
            click.echo(("ok    " if good else "FAIL  ") + text, err=not good)

    try:   # what gunicorn's master would refuse (keys, bind, store), also waiting for the database
        config = preflight.check(log=lambda line: click.echo("wait  " + line, err=True))
    except preflight.Refused as e:
        report(False, f"configuration refused: {e}")
        sys.exit(1)
    report(True, "configuration: " + _keys_summary(config))
    report(True, _streams_summary(config))
    for warning in preflight.warnings(config):
        click.echo(f"warn  {warning}", err=True)
    for good, text in doctor_lines(config):
        report(good, text)
    try:
        os.makedirs(config.data_dir, mode=0o700, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=config.data_dir):
            pass
        report(True, f"data directory {os.path.abspath(config.data_dir)} writable")
    except OSError as e:
        report(False, f"data directory {config.data_dir} not writable: {e}")
    try:
        from ..tokenize import Tokenizer
        tok = Tokenizer(segmenter=config.segmenter, user_dict=config.user_dict, stem=config.stem)
        tokens = tok.tokens("订单管理系统 ORD-7890")
        report("订单" in tokens, f"jieba dictionary loads ({tok.segmenter}): {' '.join(tokens)}")
    except Exception as e:  # noqa: BLE001 - doctor reports whatever breaks
        report(False, f"tokenizer failed: {e}")
    from ..budget import Budget
    b = Budget.of(config)           # (a limit too low for the configuration is a warning above, not a failure)
    if not quiet:
        click.echo(f"ok    open-files limit {b.limit}: each process keeps {b.shards} day files, the files of "
                   f"{b.tenants} tenants and {b.read_indexes} read indexes open, closing the least recently used")
    data = os.path.abspath(config.data_dir)
    loose = [p for p in [data, *(os.path.join(d, n) for d, ds, fs in os.walk(data) for n in ds + fs)]
             if os.path.exists(p) and os.stat(p).st_mode & 0o077][:3]
    if loose:   # a warning: data written before this check existed must not stop the start
        click.echo(f"warn  group/other may read {', '.join(loose)}: chmod -R go-rwx {data}", err=True)
    elif not quiet:
        click.echo("ok    data files are private to this user (0600/0700)")
    if config.keyless:
        if not quiet:
            click.echo("warn  no API keys configured: single 'default' tenant, no authentication")
    if not ok:
        sys.exit(1)


def _keys_summary(config: Config) -> str:
    from ..auth import KeyRing
    entries = KeyRing.from_config(config).entries
    if not entries:
        return "no API keys (single 'default' tenant, loopback only)"
    tenants = sorted({tenant for _, tenant, _ in entries})
    return f"{len(entries)} API key(s) for tenant(s) {', '.join(tenants)}"


@main.group()
def keys():
    """Manage API keys."""


@keys.command("add")
@click.option("--tenant", required=True)
@click.option("--scopes", default="push,search", show_default=True)
@click.option("--file", "path", default=None, help="Keys file (default: CONTEXT_API_KEYS_FILE).")
def keys_add(tenant, scopes, path):
    """Create a key: print it once, store only its hash."""
    from ..auth import add_key
    path = _keys_file(path)
    try:
        key = add_key(path, tenant, [s.strip() for s in scopes.split(",") if s.strip()])
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(key)
    click.echo(f"(stored sha256 only in {path}; this key is not shown again)", err=True)


def _keys_file(path: str | None) -> str:
    try:
        path = path or Config.from_env().api_keys_file
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if not path:
        raise click.UsageError("No keys file: pass --file or set CONTEXT_API_KEYS_FILE.")
    return path


@keys.command("list")
@click.option("--file", "path", default=None, help="Keys file (default: CONTEXT_API_KEYS_FILE).")
def keys_list(path):
    """List keys: id (first 12 hex digits of the hash, as in logs), tenant, scopes. Never the keys."""
    from ..auth import list_keys
    path = _keys_file(path)
    try:
        entries = list_keys(path)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if not entries:
        click.echo(f"no keys in {path}", err=True)
    for e in entries:
        click.echo(f"{e['id']}  {e['tenant']:<20} {','.join(e['scopes'])}" + ("  (plain, development)" if e["plain"] else ""))


@keys.command("revoke")
@click.argument("key_id")
@click.option("--file", "path", default=None, help="Keys file (default: CONTEXT_API_KEYS_FILE).")
def keys_revoke(key_id, path):
    """Remove the key whose id (from `keys list`) starts with KEY_ID. Takes effect when the
    service restarts or reloads (SIGHUP to gunicorn's master)."""
    from ..auth import revoke_key
    path = _keys_file(path)
    try:
        gone = revoke_key(path, key_id)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"revoked {gone['id']} (tenant {gone['tenant']}, {','.join(gone['scopes'])})")
    click.echo("restart the service or send SIGHUP to gunicorn's master for it to take effect", err=True)


# Commands that live beside the service: the stores' own (backup/restore), the MCP stdio bridge, and the client
# commands (push, search, import; list, stats, export, forget) when the Python client package is installed.
register_cli(main)
stdio.register_cli(main)
install.register_cli(main)
try:
    from . import client, manage
except ModuleNotFoundError as e:
    if e.name != "context_mode_client":
        raise
else:                   # (installed without clients/python: no push/search/import commands)
    client.register_cli(main)
    manage.register_cli(main)
