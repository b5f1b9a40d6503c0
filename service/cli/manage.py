"""Client commands to see and manage the memory: `context-mode list | stats | forget | export`.

Like push/search/import (service/cli/client.py) they talk to a running service over HTTP with
``--url``/``CONTEXT_URL`` and ``--api-key``/``CONTEXT_API_KEY``; nothing here touches the store.
"""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

import click
from context_mode_client import ContextModeError

from .client import _client, _fail, _options

SAMPLE_CHARS = 80


def register_cli(main: click.Group) -> None:
    for command in (list_units, stats, forget, export):
        main.add_command(command)


def _filters(fn):
    fn = click.option("--parent", "parent_cid", default=None, help="Only direct children of this CID.")(fn)
    fn = click.option("--until", default=None, type=int, help="Only units with timestamp <= this (Unix s).")(fn)
    fn = click.option("--since", default=None, type=int, help="Only units with timestamp >= this (Unix s).")(fn)
    fn = click.option("--source", default=None, help="Exact source, or a prefix ending in '*'.")(fn)
    fn = click.option("--type", "types", multiple=True, help="Only this type (repeatable).")(fn)
    return fn


def _filter_args(types, source, since, until, parent_cid) -> dict:
    out = {"types": list(types) or None, "source": source, "since": since, "until": until, "parent_cid": parent_cid}
    return {k: v for k, v in out.items() if v is not None}


def _when(ts) -> str:
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError, TypeError):
        return "-"


def _line(text: str, n: int = SAMPLE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "…"


@click.command("list")
@_options
@_filters
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1), help="Units to show in all.")
@click.option("--json", "as_json", is_flag=True, help="One JSON unit per line.")
def list_units(url, api_key, types, source, since, until, parent_cid, limit, as_json):
    """List live units, latest stored first: seq, CID, type, time, source and a one-line excerpt."""
    client = _client(url, api_key)
    shown = 0
    cursor = None
    try:
        while shown < limit:
            page = client.list_units(limit=min(200, limit - shown), cursor=cursor,
                                     **_filter_args(types, source, since, until, parent_cid))
            for u in page["units"]:
                if as_json:
                    click.echo(json.dumps(u, ensure_ascii=False))
                else:
                    click.echo(f"{u['seq']:>8} {u['cid']} {u['type']:<14} {_when(u['timestamp'])} "
                               f"{u['source']}  {_line(u['content'])}")
                shown += 1
            cursor = page["next_cursor"]
            if not cursor:
                break
    except ContextModeError as e:
        _fail(e)
    if not shown:
        click.echo("no units", err=True)
    elif cursor:
        click.echo(f"(showing {shown}; --limit shows more)", err=True)


@click.command()
@_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer.")
def stats(url, api_key, as_json):
    """What the memory holds: units and bytes per type and per day, index backlog, days stored."""
    try:
        s = _client(url, api_key).stats()
    except ContextModeError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(s, ensure_ascii=False, indent=2))
        return
    click.echo(f"tenant {s['tenant']}: {s['units']} live units, {s['bytes']} bytes of content")
    click.echo(f"oldest {_when(s['oldest'])}, newest {_when(s['newest'])}")
    click.echo(f"waiting for indexing {s['index_pending']}, read index lag {s['replica_lag_ms']} ms")
    # days: SQLite's day files or PostgreSQL's days with rows (the answer's day_files covers both)
    days = s["day_files"]
    click.echo(f"days stored {days['count']} ({days['bytes']} bytes on disk)"
               + (f", {days['first']} .. {days['last']}" if days["count"] else ""))
    for name, t in s["types"].items():
        click.echo(f"  {name:<16} {t['units']:>9} units {t['bytes']:>12} bytes")
    for d in s["days"]:
        per = " ".join(f"{k}={v}" for k, v in sorted(d["types"].items()))
        click.echo(f"  {d['day']} {d['units']:>9} units  {per}")


@click.command()
@_options
@_filters
@click.option("--query", default=None, help="Only units holding these words.")
@click.option("--any", "any_word", is_flag=True, help="With --query: units holding any word (default: every word).")
@click.option("--cid", "cids", multiple=True, help="Only this unit (repeatable).")
@click.option("--dry-run", is_flag=True, help="Only count what would be forgotten.")
@click.option("--yes", is_flag=True, help="Forget without asking (after the dry run).")
def forget(url, api_key, types, source, since, until, parent_cid, query, any_word, cids, dry_run, yes):
    """Forget units by filter, query or CID (admin key): a dry run counts them first, then asks."""
    args = _filter_args(types, source, since, until, parent_cid)
    if query is not None:
        args["query"] = query
        args["operator"] = "or" if any_word else "and"
    if cids:
        args["cids"] = list(cids)
    if not args:
        raise click.UsageError("Name what to forget: --type, --source, --since, --until, --parent, --query or --cid.")
    client = _client(url, api_key)
    try:
        dry = client.forget(**args)
    except ContextModeError as e:
        _fail(e)
    click.echo(f"{dry['count']} unit(s) match")
    for u in dry["sample"]:
        click.echo(f"  {u['cid']} {u['type']:<14} {_when(u['timestamp'])} {u['source']}")
    if len(dry["sample"]) < dry["count"]:
        click.echo(f"  ... and {dry['count'] - len(dry['sample'])} more")
    if dry_run or not dry["count"]:
        return
    if not yes and not click.confirm(f"Forget these {dry['count']} unit(s)? This cannot be undone", default=False):
        click.echo("nothing forgotten", err=True)
        sys.exit(1)
    try:
        done = client.forget(confirm=dry["confirm"], **args)
    except ContextModeError as e:
        _fail(e)
    click.echo(f"forgot {done['forgotten']} unit(s)")


@click.command()
@_options
@_filters
@click.argument("path", default="-", type=click.Path(dir_okay=False, allow_dash=True, writable=True))
def export(url, api_key, types, source, since, until, parent_cid, path):
    """Write every live unit (optionally filtered) as JSONL to PATH (default stdout), oldest first.
    `context-mode import PATH` restores them with the same CIDs (into any tenant)."""
    client = _client(url, api_key)
    n = 0
    try:
        with click.open_file(path, "w", encoding="utf-8", atomic=path != "-") as out:
            for unit in client.export(**_filter_args(types, source, since, until, parent_cid)):
                out.write(json.dumps(unit, ensure_ascii=False, separators=(",", ":")) + "\n")
                n += 1
    except ContextModeError as e:
        _fail(e)
    click.echo(f"exported {n} unit(s)" + ("" if path == "-" else f" to {path}"), err=True)
