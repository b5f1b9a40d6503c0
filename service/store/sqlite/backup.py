"""`context-mode backup DIR` and `context-mode restore DIR`: online, consistent copies.

Every file is copied with SQLite's online backup API, so the service keeps running and each
copied file is one transactionally consistent snapshot. Per tenant the day shards are copied
FIRST and catalog.db LAST: a push reserves its catalog row before it stores the shard row
(docs/design.md §2), so every shard row in the backup has its catalog row. The catalog may
also hold reservations for units pushed after their shard was copied; the backup has no shard
row for those, so they read as absent, exactly like a push that crashed before its ack (and a
later push of the same CID repairs the reservation). Replicas are not copied: they are derived
and the running service rebuilds them. Pending rows stay pending and are indexed at start. A
tenant's tool registry (tools.db) is copied too; its change log (events.db) is not: it
only tells open streams what changed.

Paths are only ever built from validated tenant names and ``YYYY-MM-DD.db`` file names, both
when reading a data directory and when reading a (possibly hostile) manifest.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import sqlite3
import time
from pathlib import Path

import click

from ...config import Config, redact
from ...formats import DAY_FILE_RE, TENANT_RE
from .rows import delete_rows
from .queries import fetch_all, fetch_one, sql

MANIFEST = "manifest.json"
FORMAT = 1
# The rows the manifest counts, per kind of file (named statements in sql/sqlite/queries.sql).
_COUNT_SQL = {"catalog": "backup_count_catalog", "shard": "backup_count_shard",
              "tools": "backup_count_tools"}      # the tool registry, tools.db


# A day file with its SQLite side files, or a replica refresh's temporary copy.
_DAY_FILE_ANY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}\.db(-wal|-shm|-journal|\.tmp-[0-9-]+|\.restoring)?$")


class BackupError(click.ClickException):
    """A refused or failed backup/restore (exit status 1, message on stderr)."""


def _tenant_names(root: Path) -> list[str]:
    base = root / "tenants"
    if not base.is_dir():
        return []
    return sorted(n for n in os.listdir(base) if TENANT_RE.match(n) and (base / n).is_dir())


def _day_files(primary: Path) -> list[str]:
    if not primary.is_dir():
        return []
    return sorted(n for n in os.listdir(primary) if DAY_FILE_RE.match(n))


def _check_tenant(name) -> str:
    if not isinstance(name, str) or not TENANT_RE.match(name):
        raise BackupError(f"invalid tenant name in manifest: {name!r}")
    return name


def _check_day_file(name) -> str:
    if not isinstance(name, str) or not DAY_FILE_RE.match(name):
        raise BackupError(f"invalid shard file name in manifest: {name!r}")
    return name


def _uri(path: Path, mode: str) -> str:
    """A SQLite URI for a path that may hold '?', '#' or '%' (percent-encoded by as_uri)."""
    return f"{Path(path).resolve().as_uri()}?mode={mode}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _copy_db(src_path: Path, dst_path: Path, *, src_readonly: bool) -> None:
    """One consistent snapshot of ``src_path`` into a new self-contained file (rollback journal)."""
    # mode=rw never creates a file the janitor just unlinked; mode=ro for backup files we only read.
    mode = "ro" if src_readonly else "rw"
    src = sqlite3.connect(_uri(src_path, mode), uri=True, timeout=30)
    try:
        src.execute("PRAGMA busy_timeout=30000")
        dst = sqlite3.connect(str(dst_path), isolation_level=None)
        try:
            # pages=-1 (the default): one step under one read transaction, so one snapshot; in WAL
            # mode writers in the service carry on meanwhile.
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
        finally:
            dst.close()
    finally:
        src.close()
    _fsync(dst_path)


def _drop_orphans(shard: Path, catalog: Path) -> int:
    """Delete shard rows the catalog copy does not name (deleted or purged between the two copies).

    Without this a unit deleted during the backup would come back in search (which reads the
    shards) while GET (which asks the catalog first) says 404.
    """
    conn = sqlite3.connect(str(shard), isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(sql("backup_attach_catalog"), {"path": str(catalog)})
        cids = [r[0] for r in fetch_all(conn, "backup_orphans")]
        conn.execute(sql("backup_detach_catalog"))
        if cids:
            conn.execute("BEGIN IMMEDIATE")
            delete_rows(conn, cids)
            conn.execute("COMMIT")
    finally:
        conn.close()
    _fsync(shard)
    return len(cids)


def _counts(path: Path, kind: str) -> dict:
    conn = sqlite3.connect(_uri(path, "ro"), uri=True)
    try:
        row = fetch_one(conn, _COUNT_SQL[kind])
    finally:
        conn.close()
    if kind == "shard":
        return {"units": row[0], "pending": row[1]}
    return {"rows": row[0]}


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(_uri(path, "ro"), uri=True)
    try:
        return "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check").fetchall())
    finally:
        conn.close()


def backup(data_dir: Path, out_dir: Path) -> dict:
    """Copy every tenant's day shards, then its catalog, into ``out_dir``; return the manifest."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if not (data_dir / "tenants").is_dir():
        raise BackupError(f"{data_dir} is not a data directory (no tenants/)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BackupError(f"backup directory {out_dir} is not empty")
    started = time.time()
    tenants: dict[str, dict] = {}
    for name in _tenant_names(data_dir):
        src_t, dst_t = data_dir / "tenants" / name, out_dir / "tenants" / name
        (dst_t / "primary").mkdir(parents=True, exist_ok=True)
        copied = []
        # Shards first, catalog last: see the module docstring for why that order is consistent.
        for fname in _day_files(src_t / "primary"):
            dst = dst_t / "primary" / fname
            try:
                _copy_db(src_t / "primary" / fname, dst, src_readonly=False)
            except sqlite3.OperationalError:
                if (src_t / "primary" / fname).exists():
                    raise
                dst.unlink(missing_ok=True)  # the janitor unlinked this fully expired day meanwhile
                continue
            copied.append(fname)
        entry: dict = {"shards": {}, "catalog": None}
        if (src_t / "catalog.db").exists():
            dst = dst_t / "catalog.db"
            _copy_db(src_t / "catalog.db", dst, src_readonly=False)
            entry["catalog"] = {**_counts(dst, "catalog"), "bytes": dst.stat().st_size, "sha256": _sha256(dst)}
        if (src_t / "tools.db").exists():
            # The tool registry stands alone (no unit refers to it): one consistent copy of its own.
            dst = dst_t / "tools.db"
            _copy_db(src_t / "tools.db", dst, src_readonly=False)
            entry["tools"] = {**_counts(dst, "tools"), "bytes": dst.stat().st_size, "sha256": _sha256(dst)}
        for fname in copied:
            dst = dst_t / "primary" / fname
            orphans = _drop_orphans(dst, dst_t / "catalog.db") if entry["catalog"] else 0
            entry["shards"][fname] = {**_counts(dst, "shard"), "orphans_dropped": orphans,
                                      "bytes": dst.stat().st_size, "sha256": _sha256(dst)}
        tenants[name] = entry
    manifest = {
        "format": FORMAT, "created_unix": round(started, 3),
        "created": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
        "finished_unix": round(time.time(), 3), "sqlite_version": sqlite3.sqlite_version,
        "source": str(data_dir.resolve()), "tenants": tenants,
        "totals": {"tenants": len(tenants),
                   "shards": sum(len(t["shards"]) for t in tenants.values()),
                   "units": sum(s["units"] for t in tenants.values() for s in t["shards"].values())},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    # The manifest is written last and atomically: a backup without one is incomplete.
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, out_dir / MANIFEST)
    return manifest


def _service_running(tenant_dir: Path) -> bool:
    """True when a live process holds the tenant's maintenance lock (a server is using the data dir)."""
    lock = tenant_dir / "maintenance.lock"
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)   # closing drops the lock if we got it
    return False


def _remove_sqlite(path: Path) -> None:
    """A database file and its -wal/-shm: a stale WAL left beside a restored file would be replayed into it."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _restore_plan(backup_dir: Path) -> list[tuple[str, dict, list[str]]]:
    """(tenant, manifest entry, day files) per backed-up tenant, every name validated before anything
    is touched."""
    try:
        manifest = json.loads((backup_dir / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackupError(f"{backup_dir} has no {MANIFEST}: not a (complete) backup") from None
    except ValueError as e:
        raise BackupError(f"{backup_dir / MANIFEST} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("tenants"), dict):
        raise BackupError(f"unsupported backup manifest format: {manifest.get('format') if isinstance(manifest, dict) else None!r}")
    plan: list[tuple[str, dict, list[str]]] = []
    for name, entry in manifest["tenants"].items():
        _check_tenant(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("shards"), dict):
            raise BackupError(f"malformed manifest entry for tenant {name!r}")
        plan.append((name, entry, [_check_day_file(f) for f in entry["shards"]]))
    return plan


def _restore_file(src: Path, dst: Path, kind: str, expected, problems: list[str]) -> int:
    """Copy one backed-up file into place and verify it; return the units it holds."""
    if not src.is_file():
        raise BackupError(f"backup file missing: {src}")
    tmp = dst.with_name(dst.name + ".restoring")
    _remove_sqlite(tmp)
    _copy_db(src, tmp, src_readonly=True)
    os.replace(tmp, dst)
    check = _integrity(dst)
    counts = _counts(dst, kind)
    if check != "ok":
        problems.append(f"{dst}: integrity_check: {check}")
    if isinstance(expected, dict):
        for k, v in counts.items():
            if expected.get(k) != v:
                problems.append(f"{dst}: {k} = {v}, manifest says {expected.get(k)}")
    return counts.get("units", 0)


def restore(backup_dir: Path, data_dir: Path, *, force: bool = False) -> dict:
    """Copy a backup into ``data_dir``, verify every restored file; return a summary."""
    backup_dir, data_dir = Path(backup_dir), Path(data_dir)
    plan = _restore_plan(backup_dir)
    if data_dir.exists() and any(data_dir.iterdir()) and not force:
        raise BackupError(f"data directory {data_dir} is not empty; pass --force to replace the backed-up tenants")
    for name, _, _ in plan:
        if _service_running(data_dir / "tenants" / name):
            raise BackupError(f"a running service holds tenant {name!r} in {data_dir}; stop it before restoring")

    summary: dict = {"tenants": {}, "files": 0, "units": 0, "problems": []}
    for name, entry, day_files in plan:
        src_t, dst_t = backup_dir / "tenants" / name, data_dir / "tenants" / name
        (dst_t / "primary").mkdir(parents=True, exist_ok=True)
        (dst_t / "replica").mkdir(parents=True, exist_ok=True)
        # --force: the tenant becomes exactly the backup; its replicas are derived and rebuilt.
        for d in ("primary", "replica"):
            for fname in os.listdir(dst_t / d):
                if _DAY_FILE_ANY_RE.match(fname):
                    (dst_t / d / fname).unlink(missing_ok=True)
        _remove_sqlite(dst_t / "catalog.db")
        _remove_sqlite(dst_t / "tools.db")
        files = [(src_t / "primary" / f, dst_t / "primary" / f, "shard", entry["shards"][f]) for f in day_files]
        if entry.get("catalog") is not None:
            files.append((src_t / "catalog.db", dst_t / "catalog.db", "catalog", entry["catalog"]))
        if entry.get("tools") is not None:
            files.append((src_t / "tools.db", dst_t / "tools.db", "tools", entry["tools"]))
        units = sum(_restore_file(*f, summary["problems"]) for f in files)
        summary["files"] += len(files)
        _fsync(dst_t / "primary")
        summary["tenants"][name] = {"shards": len(day_files), "units": units}
        summary["units"] += units
    if summary["problems"]:
        raise BackupError("restore finished with problems:\n  " + "\n  ".join(summary["problems"]))
    return summary


OWN_TOOLS = {"postgresql": ("PostgreSQL", "Back PostgreSQL up with its own tools (pg_dump, pg_basebackup; "
                                          "docs/postgresql.md), or")}


def _default_data_dir() -> str:
    """CONTEXT_DATA_DIR, or an error when the configured store is not SQLite's files: backing up ./data while
    the service writes elsewhere (PostgreSQL, or any backend added later) would copy nothing, or an older
    store, and say it worked."""
    config = Config.from_env()
    if config.backend != "sqlite":
        name, advice = OWN_TOOLS.get(config.backend, (config.backend, "Use that store's own backup, or"))
        raise click.ClickException(
            f"CONTEXT_STORE is {name} ({redact(config.store)}): backup and restore copy SQLite data files. "
            f"{advice} `context-mode export` the units; pass --data-dir to work on a SQLite data directory anyway.")
    return config.data_dir


def register_cli(main: click.Group) -> None:
    @main.command("backup")
    @click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Data directory (default: CONTEXT_DATA_DIR or ./data).")
    def backup_cmd(directory, data_dir):
        """Online, consistent backup of every tenant into DIRECTORY (SQLite backup API)."""
        m = backup(data_dir or Path(_default_data_dir()), directory)
        for name, t in m["tenants"].items():
            click.echo(f"{name}: {len(t['shards'])} shard(s), "
                       f"{sum(s['units'] for s in t['shards'].values())} unit(s), "
                       f"catalog {t['catalog']['rows'] if t['catalog'] else 0} row(s)")
        click.echo(f"backup complete: {m['totals']['units']} units in {m['totals']['shards']} shards "
                   f"of {m['totals']['tenants']} tenant(s) -> {directory} "
                   f"({m['finished_unix'] - m['created_unix']:.2f} s)")

    @main.command("restore")
    @click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Data directory (default: CONTEXT_DATA_DIR or ./data).")
    @click.option("--force", is_flag=True, help="Restore into a non-empty data directory, replacing the "
                  "backed-up tenants' files.")
    def restore_cmd(directory, data_dir, force):
        """Restore a backup made by `context-mode backup` (the service must be stopped)."""
        s = restore(directory, data_dir or Path(_default_data_dir()), force=force)
        for name, t in s["tenants"].items():
            click.echo(f"{name}: {t['shards']} shard(s), {t['units']} unit(s), integrity ok")
        click.echo(f"restore complete: {s['units']} units, {s['files']} files verified; replicas are "
                   "rebuilt and pending rows indexed when the service starts")
