"""Change numbers that every process of one data folder shares, so that a search learns whether anything it
depends on has changed without a system call (docs/design.md §11, "The fast path of a default search").

One small file, ``<data folder>/signals``, mapped into the memory of every process that opens the folder's
store: a number per tenant and kind. A writer sets a new number after each change it makes (a random one, so
that writers never need a lock to agree on the next value: a reader only asks whether the number differs from
the one it saw); a reader reads it from memory, which costs no system call and never lets go of the
interpreter, where the file checks and SQL statements it replaces each did both.

- ``INDEX``: the tenant's read index was committed, marked ready, or its leader wrote its state.
- ``CATALOG``: a transaction on the tenant's catalog committed (a push, delete, forget, expiry, merge...).

A reader reads the number *before* what it caches, so a change that lands while it reads is seen by the next
search. Tenants share slots by a hash of their name: a tenant's change then also looks like a change of the
others in its slot, which costs them one read more, never a missed change.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
import zlib
from pathlib import Path

INDEX, CATALOG = 0, 1
KINDS = 2
SLOTS = 4096                     # per kind: 64 KiB in all
_WORD = struct.Struct("=Q")

_opened: dict[str, "Signals"] = {}
_opened_lock = threading.Lock()


class Signals:
    """The change numbers of one data folder."""

    def __init__(self, root: Path):
        self.path = Path(root) / "signals"
        self._map: mmap.mmap | None = None
        self._ino: int | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, root: Path) -> "Signals":
        """The process's one mapping of this folder's file (the stores, readers and index writers share it)."""
        key = os.path.abspath(root)
        with _opened_lock:
            signals = _opened.get(key)
            if signals is None or not signals._same_file():
                signals = _opened[key] = cls(Path(key))     # (a folder removed and made again: its new file)
            return signals

    def _same_file(self) -> bool:
        if self._map is None:
            return True
        try:
            return os.stat(self.path).st_ino == self._ino
        except OSError:
            return False

    def _mapped(self) -> mmap.mmap:
        m = self._map
        if m is None:
            with self._lock:
                if self._map is None:
                    size = KINDS * SLOTS * _WORD.size
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                    try:
                        if os.fstat(fd).st_size < size:
                            os.ftruncate(fd, size)      # (zeros; two processes doing it at once agree)
                        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                        self._ino = os.fstat(fd).st_ino
                    finally:
                        os.close(fd)                    # the mapping keeps the file
                m = self._map
        return m

    @staticmethod
    def _offset(kind: int, name: str) -> int:
        return (kind * SLOTS + zlib.crc32(name.encode()) % SLOTS) * _WORD.size

    def read(self, kind: int, name: str) -> int:
        """The number of ``name``'s ``kind`` now: equal to one read before only if nothing changed since."""
        return _WORD.unpack_from(self._mapped(), self._offset(kind, name))[0]

    def changed(self, kind: int, name: str) -> None:
        """Tell every process that ``name``'s ``kind`` has changed (after the change is visible to them)."""
        _WORD.pack_into(self._mapped(), self._offset(kind, name), int.from_bytes(os.urandom(8), "little"))
