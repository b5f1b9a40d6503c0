"""Client commands of `context-mode`: push, search, import, hook (built on ``context_mode_client``).

They talk to a running service over HTTP like any other client (``--url``/``CONTEXT_URL``,
``--api-key``/``CONTEXT_API_KEY``); nothing here touches the store directly.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

import click
from context_mode_client import ContextModeClient, ContextModeError

from context_mode_client import textsplit
from ..formats import CONTROL_CHARS_RE
from .env import KEY_VAR, URL_VAR, from_env

MAX_REPORTED = 20


def _key_from_env(ctx, param, value):
    return value if value is not None else from_env(KEY_VAR)


def _options(fn):
    fn = click.option("--api-key", default=None, callback=_key_from_env,
                      help=f"API key (Bearer) [env var: {KEY_VAR}].")(fn)
    fn = click.option("--url", envvar=URL_VAR, default="http://127.0.0.1:5000", show_default=True,
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
    main.add_command(hook)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def hook(args):
    """Agent hook: CLIENT EVENT, the event JSON on stdin (clients/MCP.md, "Agent hooks").

    Stores tool outputs and prompts, answers relevant earlier context in the agent's format; never
    fails the agent (see `context-mode hook check`). The same as `context-mode-hook`, which agents
    should call: it starts without loading the service (~300 ms less per call).
    """
    from context_mode_client.hooks.cli import main as hook_main
    hook_main(list(args))


@click.command()
@_options
@click.argument("content", required=False)
@click.option("--type", "type_", default="tool_output", show_default=True, help="Unit type.")
@click.option("--source", default="context-mode_cli", show_default=True, help="Producer, e.g. curl_tool_v2.1_prod.")
@click.option("--ttl", default=None, type=int, help="Seconds to keep the unit (default: the server's).")
@click.option("--timestamp", default=None, type=int, help="Unix seconds (default: now).")
@click.option("--metadata", default=None, help="A JSON object.")
@click.option("--parent", "parent_cid", default=None, help="CID of the parent unit.")
@click.option("--project", default=None, help="Sets metadata.project: searches with --project see the unit.")
@click.option("--global", "is_global", is_flag=True,
              help="Sets metadata.global: the unit is seen from every project (e.g. agent hooks in any repository).")
def push(url, api_key, content, type_, source, ttl, timestamp, metadata, parent_cid, project, is_global):
    """Push one unit; CONTENT is the text ('-' or nothing reads stdin). Prints the CID."""
    if content is None or content == "-":
        content = sys.stdin.read()
    meta = None
    if metadata is not None:
        try:
            meta = json.loads(metadata)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--metadata") from None
        if (project is not None or is_global) and not isinstance(meta, dict):
            raise click.BadParameter("must be a JSON object to take --project or --global", param_hint="--metadata")
    try:
        rv = _client(url, api_key).push(content, type=type_, source=source, ttl=ttl, timestamp=timestamp,
                                        metadata=meta, parent_cid=parent_cid, project=project,
                                        is_global=is_global)
    except ContextModeError as e:
        _fail(e)
    click.echo(f"{rv['cid']} {rv['status']} seq={rv['seq']}")


@click.command()
@_options
@click.argument("query")
@click.option("--top-k", default=10, show_default=True, type=int)
@click.option("--type", "types", multiple=True, help="Only this type (repeatable).")
@click.option("--source", default=None, help="Exact source, or a prefix ending in '*'.")
@click.option("--project", default=None, help="Only this project's units (metadata.project) and global ones.")
@click.option("--min-score", default=None, type=float)
@click.option("--strong", is_flag=True, help="Read-your-writes: include units pushed just now.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer.")
def search(url, api_key, query, top_k, types, source, project, min_score, strong, as_json):
    """Search units; prints score, CID, type, source and a one-line excerpt per result."""
    params = {"top_k": top_k}
    if types:
        params["types"] = list(types)
    if source:
        params["source"] = source
    if project is not None:
        params["project"] = project
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


FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".md": "markdown", ".markdown": "markdown",
           ".txt": "text", ".text": "text"}


def _guess_format(path: str) -> str:
    if path == "-":
        return "jsonl"
    return FORMATS.get(os.path.splitext(path)[1].lower(), "text")


def _default_source(path: str) -> str:
    """``import_<file name>``, cleaned to the unit contract (no control characters, 200 chars)."""
    name = "stdin" if path == "-" else os.path.basename(path)
    return ("import_" + CONTROL_CHARS_RE.sub("_", name))[:200]


def _file_units(text: str, fmt: str, max_chars: int, name: str):
    """(line number, unit dict or None, error code, message) for each unit the file holds."""
    if fmt == "jsonl":
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                unit = json.loads(line)
            except ValueError as e:
                yield lineno, None, "invalid_json", str(e)
                continue
            if not isinstance(unit, dict):
                yield lineno, None, "invalid_unit", "a line must hold one JSON object"
                continue
            yield lineno, unit, None, None
        return
    split = textsplit.split_markdown if fmt == "markdown" else textsplit.split_text
    for chunk in split(text, max_chars):
        meta = {"file": name, "line": chunk.line}
        if chunk.section:
            meta["section"] = chunk.section
        yield chunk.line, {"content": chunk.text, "metadata": meta}, None, None


class _Import:
    """One import run's pushes: batches, counts, failures, and units waiting for their parent."""

    def __init__(self, client, batch_size: int):
        self.client = client
        self.batch_size = batch_size
        self.counts: Counter = Counter()
        self.failures: list[tuple[int, str, str]] = []   # (line number, code, message)
        self.batch: list[tuple[int, dict]] = []
        self.waiting: list[tuple[int, dict, str]] = []   # parent not stored yet: maybe later in the file

    def flush(self) -> None:
        if not self.batch:
            return
        try:
            results = self.client.push_batch([u for _, u in self.batch])
        except ContextModeError as e:
            for lineno, _ in self.batch:
                self.failures.append((lineno, e.code, e.message))
            self.counts["error"] += len(self.batch)
        else:
            for r in results:
                lineno, unit = self.batch[r["index"]]
                if r["status"] == "error" and r.get("code") == "parent_not_found":
                    self.waiting.append((lineno, unit, r.get("error", "")))
                    continue
                self.counts[r["status"]] += 1
                if r["status"] == "error":
                    self.failures.append((lineno, r.get("code", "?"), r.get("error", "")))
        self.batch.clear()

    def retry_waiting(self) -> None:
        """Units whose parent came later in the file (an export lists by ack order; a re-push may have
        given a unit a newer parent): push them again while that stores any."""
        while self.waiting:
            pending = list(self.waiting)
            self.waiting.clear()
            for i in range(0, len(pending), self.batch_size):
                self.batch.extend((lineno, unit) for lineno, unit, _ in pending[i:i + self.batch_size])
                self.flush()
            if len(self.waiting) == len(pending):
                break
        for lineno, _, message in self.waiting:
            self.counts["error"] += 1
            self.failures.append((lineno, "parent_not_found", message))
        self.waiting.clear()


@click.command("import")
@_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["auto", "jsonl", "markdown", "text"]), default="auto",
              show_default=True, help="auto: by extension (.jsonl/.ndjson/.json, .md/.markdown; else text).")
@click.option("--type", "type_", default="tool_output", show_default=True, help="Type of units that name none.")
@click.option("--source", default=None, help="Source of units that name none (default: import_<file name>).")
@click.option("--timestamp", default=None, type=int, help="Timestamp of units that name none (default: now).")
@click.option("--ttl", default=None, type=int, help="ttl of units that name none (default: the server's).")
@click.option("--max-chars", default=2000, show_default=True, type=click.IntRange(100, 1_000_000),
              help="Markdown/text: at most this many characters per unit.")
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(1, 1000))
def import_jsonl(url, api_key, path, fmt, type_, source, timestamp, ttl, max_chars, batch_size):
    """Import units from JSONL (one unit per line), markdown (one unit per section) or plain text.

    JSONL lines need only "content": type, source, timestamp and ttl default to the options
    (all units of one run share the same default timestamp). Bad lines and rejected units are
    reported at the end with their line number and reason; the exit status is 1 when anything
    failed.
    """
    with click.open_file(path, encoding="utf-8") as fh:
        text = fh.read()
    fmt = _guess_format(path) if fmt == "auto" else fmt
    defaults = {"type": type_, "source": source or _default_source(path),
                "timestamp": int(time.time()) if timestamp is None else timestamp}
    if ttl is not None:
        defaults["ttl"] = ttl
    items = list(_file_units(text, fmt, max_chars, os.path.basename(path) if path != "-" else "stdin"))
    run = _Import(_client(url, api_key), batch_size)
    counts, failures = run.counts, run.failures

    def status(_item) -> str:
        return f"{counts['ok']} new, {counts['duplicate']} duplicate, {counts['error']} failed"

    with click.progressbar(length=len(items), label=f"importing {fmt}", file=sys.stderr, show_pos=True,
                           item_show_func=status) as bar:
        for i, (lineno, unit, code, message) in enumerate(items, start=1):
            if unit is None:
                counts["error"] += 1
                failures.append((lineno, code, message))
            else:
                run.batch.append((lineno, {**defaults, **unit}))
            if len(run.batch) >= batch_size or i == len(items):
                run.flush()             # before the step, so the bar's last frame has the final counts
            bar.update(1, lineno)
    run.retry_waiting()

    click.echo(f"imported {counts['ok']} new, {counts['duplicate']} duplicate, {counts['error']} failed")
    if failures:
        by_code = Counter(code for _, code, _ in failures)
        click.echo("failures by code: " + ", ".join(f"{c}={n}" for c, n in by_code.most_common()))
        for lineno, code, message in sorted(failures)[:MAX_REPORTED]:
            click.echo(f"  line {lineno}: {code}: {message}")
        if len(failures) > MAX_REPORTED:
            click.echo(f"  ... and {len(failures) - MAX_REPORTED} more")
        sys.exit(1)
