"""Client commands of `context-mode`: push, search, import (built on ``context_mode_client``).

They talk to a running service over HTTP like any other client (``--url``/``CONTEXT_URL``,
``--api-key``/``CONTEXT_API_KEY``); nothing here touches the store directly.
"""
from __future__ import annotations

import json
import sys
from collections import Counter

import click
from context_mode_client import ContextModeClient, ContextModeError

MAX_REPORTED = 20


def _options(fn):
    fn = click.option("--api-key", envvar="CONTEXT_API_KEY", default=None, show_envvar=True,
                      help="API key (Bearer).")(fn)
    fn = click.option("--url", envvar="CONTEXT_URL", default="http://127.0.0.1:5000", show_default=True,
                      show_envvar=True, help="Base URL of the service.")(fn)
    return fn


def _client(url: str, api_key: str | None) -> ContextModeClient:
    return ContextModeClient(url, api_key)


def _fail(e: ContextModeError) -> None:
    raise click.ClickException(str(e))


def register_cli(main: click.Group) -> None:
    main.add_command(push)
    main.add_command(search)
    main.add_command(import_jsonl)


@click.command()
@_options
@click.argument("content", required=False)
@click.option("--type", "type_", default="tool_output", show_default=True, help="Unit type.")
@click.option("--source", required=True, help="Producer, e.g. curl_tool_v2.1_prod.")
@click.option("--ttl", default=86400, show_default=True, type=int, help="Seconds to keep the unit.")
@click.option("--timestamp", default=None, type=int, help="Unix seconds (default: now).")
@click.option("--metadata", default=None, help="A JSON object.")
@click.option("--parent", "parent_cid", default=None, help="CID of the parent unit.")
def push(url, api_key, content, type_, source, ttl, timestamp, metadata, parent_cid):
    """Push one unit; CONTENT is the text ('-' or nothing reads stdin). Prints the CID."""
    if content is None or content == "-":
        content = sys.stdin.read()
    meta = None
    if metadata is not None:
        try:
            meta = json.loads(metadata)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--metadata") from None
    try:
        rv = _client(url, api_key).push(content, type=type_, source=source, ttl=ttl, timestamp=timestamp,
                                        metadata=meta, parent_cid=parent_cid)
    except ContextModeError as e:
        _fail(e)
    click.echo(f"{rv['cid']} {rv['status']} seq={rv['seq']}")


@click.command()
@_options
@click.argument("query")
@click.option("--top-k", default=10, show_default=True, type=int)
@click.option("--type", "types", multiple=True, help="Only this type (repeatable).")
@click.option("--source", default=None, help="Exact source, or a prefix ending in '*'.")
@click.option("--min-score", default=None, type=float)
@click.option("--strong", is_flag=True, help="Read-your-writes: include units pushed just now.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer.")
def search(url, api_key, query, top_k, types, source, min_score, strong, as_json):
    """Search units; prints score, CID, type, source and a one-line excerpt per result."""
    params = {"top_k": top_k}
    if types:
        params["types"] = list(types)
    if source:
        params["source"] = source
    if min_score is not None:
        params["min_score"] = min_score
    if strong:
        params["consistency"] = "strong"
    try:
        rv = _client(url, api_key).search(query, **params)
    except ContextModeError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(rv, ensure_ascii=False, indent=2))
        return
    if not rv["results"]:
        click.echo("no results", err=True)
    for r in rv["results"]:
        line = " ".join(r["content"].split())
        click.echo(f"{r['score']:.3f} {r['cid']} {r['type']} {r['source']}  {line[:100]}")


@click.command("import")
@_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(1, 1000))
def import_jsonl(url, api_key, path, batch_size):
    """Import units from a JSONL file (one unit object per line) in batches.

    Bad lines and rejected units are reported at the end with their line number and reason;
    the exit status is 1 when anything failed.
    """
    with click.open_file(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    client = _client(url, api_key)
    counts: Counter = Counter()
    failures: list[tuple[int, str, str]] = []   # (line number, code, message)
    batch: list[tuple[int, dict]] = []

    def flush():
        if not batch:
            return
        try:
            results = client.push_batch([u for _, u in batch])
        except ContextModeError as e:
            for lineno, _ in batch:
                failures.append((lineno, e.code, e.message))
            counts["error"] += len(batch)
        else:
            for r in results:
                lineno = batch[r["index"]][0]
                counts[r["status"]] += 1
                if r["status"] == "error":
                    failures.append((lineno, r.get("code", "?"), r.get("error", "")))
        batch.clear()

    with click.progressbar(length=len(lines), label="importing", file=sys.stderr) as bar:
        for lineno, line in enumerate(lines, start=1):
            bar.update(1)
            if not line.strip():
                continue
            try:
                unit = json.loads(line)
            except ValueError as e:
                counts["error"] += 1
                failures.append((lineno, "invalid_json", str(e)))
                continue
            if not isinstance(unit, dict):
                counts["error"] += 1
                failures.append((lineno, "invalid_unit", "a line must hold one JSON object"))
                continue
            batch.append((lineno, unit))
            if len(batch) >= batch_size:
                flush()
        flush()

    click.echo(f"imported {counts['ok']} new, {counts['duplicate']} duplicate, {counts['error']} failed")
    if failures:
        by_code = Counter(code for _, code, _ in failures)
        click.echo("failures by code: " + ", ".join(f"{c}={n}" for c, n in by_code.most_common()))
        for lineno, code, message in sorted(failures)[:MAX_REPORTED]:
            click.echo(f"  line {lineno}: {code}: {message}")
        if len(failures) > MAX_REPORTED:
            click.echo(f"  ... and {len(failures) - MAX_REPORTED} more")
        sys.exit(1)
