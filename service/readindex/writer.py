"""The leader's side of one tenant's read index, on either store: open it (or start it empty when it is
missing, damaged, of another format or a build that never finished), add and delete documents, commit,
mark a build ready, and write the state every worker's freshness report reads. What to send and when is
the store's (service/store/sqlite/readsync.py)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from functools import partial
from pathlib import Path

import tantivy

from ..ranking.bm25 import B, K1
from ..change_numbers import INDEX
from .schema import build_schema, format_info, index_dir, register, same_format

log = logging.getLogger(__name__)


class IndexWriter:
    """One tenant's index files, written by one process at a time (the tenant's maintenance leader).
    ``building``: started empty and not yet marked ready; readers use the store meanwhile."""

    def __init__(self, path: Path, heap_mb: int, name: str, bump):
        self.path = Path(path)
        self.heap_mb = heap_mb
        self.name = name                # the tenant, for logs
        # Called after every change readers must see (a commit, a build started or ready, the state): the
        # tenant's INDEX change number (service/change_numbers.py), which is all a search looks at until it changes.
        self.bump = bump
        self.index: tantivy.Index | None = None
        self.writer = None
        self.gen: str | None = None
        self.building = False
        self.last_commit = 0.0

    @classmethod
    def of(cls, store, tenant: str) -> "IndexWriter":
        """The writer of ``tenant``'s read index in ``store``'s data folder (either backend's), telling this
        folder's readers of every change through the tenant's INDEX change number."""
        return cls(index_dir(store.root, tenant), store.config.read_index_heap_mb, tenant,
                   partial(store.readers.change_numbers.bump, INDEX, tenant))

    def usable(self) -> bool:
        """Whether the files hold a ready index of this format (else opening starts it empty), read now."""
        try:
            info = json.loads((self.path / "format.json").read_text())
        except (OSError, ValueError):
            return False
        self.gen = info.get("gen")
        # a build that never finished (the leader died) starts again from nothing
        return bool(same_format(info) and info.get("ready") and (self.path / "meta.json").exists())

    def open(self) -> bool:
        """Open the index for writing (no-op when open); True when it started empty: the caller then streams
        every document into it and calls ``mark_ready``."""
        if self.writer is not None:
            return False
        usable = self.usable()
        if usable:
            try:
                self.index = tantivy.Index(build_schema(), path=str(self.path), reuse=True)
            except (OSError, ValueError, RuntimeError) as e:
                log.warning("read index of tenant %s is unreadable (%s); rebuilding it", self.name, e)
                usable = False
        if not usable:
            self.start_empty()
        register(self.index)
        self.writer = self.index.writer(self.heap_mb * 1_000_000, 1)
        return not usable

    def start_empty(self) -> None:
        """Replace the index with an empty one, not ready (readers use the store until ``mark_ready``)."""
        log.info("building the read index of tenant %s", self.name)
        self.close()
        if self.path.exists():
            old = self.path.with_name(f"index.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.replace(self.path, old)
            shutil.rmtree(old, ignore_errors=True)
        self.path.mkdir(parents=True)
        self.gen = uuid.uuid4().hex
        self._write_format(ready=False)
        self.index = tantivy.Index(build_schema(), path=str(self.path), reuse=False)
        self.building = True
        self.bump()

    def mark_ready(self) -> None:
        """A build's first full pass is committed: readers may use the index from now on."""
        self._write_format(ready=True)
        self.building = False
        self.bump()
        log.info("read index of tenant %s is ready", self.name)

    def _write_format(self, ready: bool) -> None:
        tmp = self.path / "format.json.tmp"
        tmp.write_text(json.dumps({**format_info(), "gen": self.gen, "ready": ready, "k1": K1, "b": B}))
        os.replace(tmp, self.path / "format.json")

    def days(self) -> set[str]:
        """The days the last commit holds documents of (its term dictionary, which keeps a deleted day's name
        until a merge), read from the writer's own index: the leader loads no reader of its own (a file watcher)."""
        self.index.reload()
        return {day for day, _ in self.index.searcher().terms_with_prefix("day", "")}

    # --- changes ------------------------------------------------------------------------------
    def add(self, doc: tantivy.Document) -> None:
        self.writer.add_document(doc)

    def delete_key(self, key: int) -> None:
        self.writer.delete_documents_by_term("key", key)

    def delete_day(self, day: str) -> None:
        self.writer.delete_documents_by_term("day", day)

    def commit(self) -> None:
        self.writer.commit()
        self.last_commit = time.monotonic()
        self.bump()          # before the rows are flagged sent: a search that reads them unsent sees the commit

    def rollback(self) -> None:
        """Forget what was sent since the last commit (a failed pass); a writer that cannot is dropped."""
        try:
            self.writer.rollback()
        except (RuntimeError, ValueError):
            self.writer = None

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.rollback()
            except (RuntimeError, ValueError):
                pass
            self.writer = None
        self.index = None

    def write_state(self, state: dict) -> None:
        """What the index lacked at the end of a pass, for the freshness reports of every worker."""
        tmp = self.path / f"state.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({"ms": int(time.time() * 1000), **state}))
        os.replace(tmp, self.path / "state.json")
        self.bump()
