"""Change numbers that every process of one data folder shares, so that a search learns whether anything it
depends on has changed without looking at the files it guards (docs/design.md §11, "The fast path of a default
search").

One small file, ``<data folder>/signals``, that every process which opens the folder's store reads and writes at
fixed offsets: a number per tenant and kind. (The module was ``signals.py``; the file keeps that name, which data
folders and processes of an earlier version share.) A writer sets a new number after each change it makes (a random one,
so that writers never need a lock to agree on the next value: a reader only asks whether the number differs from
the one it saw); a reader reads it with one ``pread`` made without letting go of the interpreter (ctypes' PyDLL),
where the file checks and SQL statements it replaces each let go of it.

- ``INDEX``: the tenant's read index was committed, marked ready, or its leader wrote its state.
- ``CATALOG``: a transaction on the tenant's catalog committed (a push, delete, forget, expiry, merge...).

A reader reads the number *before* what it caches, so a change that lands while it reads is seen by the next
search. Tenants share slots by a hash of their name: a tenant's change then also looks like a change of the
others in its slot, which costs them one read more, never a missed change.

The file is checked, not trusted (issue 50, M1). Its first word is its identity (a random number); each process
looks at the path's inode, the file's size and that identity before every write, before a read when it last
looked more than ``CHECK_S`` ago, and every ``CHECK_S`` while a number it set is not yet known to be in the file
others read (a timer thread). A file removed, replaced, truncated or zeroed is taken up again, made or filled anew
when it must be, with a log line; the process then sets again, in the new file, every number it set since it last
found the file unchanged (those may have gone to the old file, unseen by the processes that had moved already);
for ``DISTRUST_S`` it also sets its new numbers in the file it left, where a process that has not looked yet
reads them; and for ``DISTRUST_S`` every read answers a new number, so each of its searches takes the slow path
(reads the files) until every process has moved. A short file is read with ``pread``, which returns fewer
bytes where a mapping would fault (SIGBUS); a path that cannot be opened leaves every read on the slow path, with
a log line, never an error.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import random
import struct
import threading
import time
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

INDEX, CATALOG = 0, 1
KINDS = 2
SLOTS = 4096                     # per kind: 64 KiB in all
_WORD = struct.Struct("=Q")
HEAD_WORDS = 1                   # the file's identity; the slots follow
SIZE = (HEAD_WORDS + KINDS * SLOTS) * _WORD.size
CHECK_S = 0.5                    # how often each process looks whether the file is still the one it reads
DISTRUST_S = 2.0                 # after a process moved to a new file: every process has looked (CHECK_S) and moved
RETIRED_S = 60.0                 # a descriptor let go is closed this much later (a thread may still be using it)

_opened: dict[str, "ChangeNumbers"] = {}
_opened_lock = threading.Lock()


def _word_reader():
    """``read(fd, offset)``: the word at ``offset`` (None where the file has fewer bytes), read without letting go
    of the interpreter: a read of a page in memory takes about a microsecond, and a call that lets go of it hands
    it to another thread under load. os.pread where libc cannot be reached."""
    try:
        call = ctypes.PyDLL(None, use_errno=True).pread
    except (OSError, AttributeError):
        call = None
    if call is None:
        def read(fd: int, offset: int) -> int | None:
            data = os.pread(fd, _WORD.size, offset)
            return _WORD.unpack(data)[0] if len(data) == _WORD.size else None
        return read
    call.restype, call.argtypes = ctypes.c_ssize_t, (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
    local = threading.local()

    def read(fd: int, offset: int) -> int | None:
        try:
            word = local.word
        except AttributeError:
            word = local.word = ctypes.c_uint64()
        return word.value if call(fd, ctypes.byref(word), _WORD.size, offset) == _WORD.size else None
    return read


_read_word = _word_reader()


class ChangeNumbers:
    """The change numbers of one data folder, as this process reads and sets them."""

    def __init__(self, root: Path):
        self.path = Path(root) / "signals"
        self._fd: int | None = None
        self._ident: tuple[int, int, int] | None = None    # (st_dev, st_ino, identity) of the file _fd is
        self._checked = float("-inf")
        self._distrust_until = 0.0
        self._written: set[int] = set()                    # offsets set since the file was last found unchanged
        self._retired: list[tuple[int, float]] = []
        self._trouble: str | None = None                   # why the file cannot be used (logged once per cause)
        self._lock = threading.Lock()
        self._timer_pid = 0                                # the process whose timer runs (none after a fork)

    @classmethod
    def of(cls, root: Path) -> "ChangeNumbers":
        """The process's one view of this folder's file (the stores, readers and index writers share it)."""
        key = os.path.abspath(root)
        with _opened_lock:
            numbers = _opened.get(key)
            if numbers is None:
                numbers = _opened[key] = cls(Path(key))
            return numbers

    @staticmethod
    def _offset(kind: int, name: str) -> int:
        return (HEAD_WORDS + kind * SLOTS + zlib.crc32(name.encode()) % SLOTS) * _WORD.size

    def read(self, kind: int, name: str) -> int:
        """The number of ``name``'s ``kind`` now: equal to one read before only if nothing changed since (a new
        number at every read while the file is not to be trusted)."""
        fd = self._usable()
        if fd is not None:
            value = _read_word(fd, self._offset(kind, name))
            if value is not None:
                return value
            self._checked = float("-inf")                  # short: looked at again at the next read
        return random.getrandbits(64)

    def bump(self, kind: int, name: str) -> None:
        """Tell every process that ``name``'s ``kind`` has changed (after the change is visible to them).

        A change looks at the file first, whenever it last looked (a stat: changes are commits, far rarer
        than reads), so it lands in the file the path names now; and for ``DISTRUST_S`` after this process
        moved off a file, in that one too: a process that has not looked since the move reads it there (else
        it would trust its old numbers for up to ``CHECK_S`` and miss the change)."""
        now = time.monotonic()
        self._check(now, always=True)
        offset = self._offset(kind, name)
        with self._lock:
            self._written.add(offset)                      # (before the write: a move meanwhile sets it again)
            fds = [fd for fd, when in self._retired if now - when < DISTRUST_S]
            if self._fd is not None:
                fds.append(self._fd)
            self._start_timer()
        for fd in fds:
            try:
                os.pwrite(fd, _WORD.pack(random.getrandbits(64)), offset)
            except OSError:
                self._checked = float("-inf")

    # --- the file, checked ---------------------------------------------------------------------------
    def _usable(self) -> int | None:
        """The file's descriptor when its numbers may be trusted now; None: take the slow path."""
        now = time.monotonic()
        if now - self._checked >= CHECK_S:
            self._check(now)
        return self._fd if now >= self._distrust_until else None

    def _check(self, now: float, always: bool = False) -> None:
        with self._lock:
            if now - self._checked < CHECK_S and not always:
                return                                     # (another thread just looked)
            self._checked = now
            self._close_retired(now)
            try:
                st = os.stat(self.path)
                same = (self._fd is not None and st.st_size >= SIZE
                        and (st.st_dev, st.st_ino, _read_word(self._fd, 0)) == self._ident)
            except FileNotFoundError:
                same = False
            except OSError as e:
                return self._failed(e)
            if same:
                self._written.clear()
            else:
                self._take_up(now)

    def _take_up(self, now: float) -> None:
        """Use the file the path names now: made, or filled anew when short or zeroed; the numbers set since the
        last good look set again in it; distrusted for a while unless it is the first this process opens."""
        first = self._ident is None and self._trouble is None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            return self._failed(e)
        try:
            st = os.fstat(fd)
            if st.st_size < SIZE:
                os.ftruncate(fd, SIZE)                     # (zeros; two processes doing it at once agree)
            if not _read_word(fd, 0):                      # made, or emptied: this process names it
                os.pwrite(fd, _WORD.pack(random.getrandbits(64) | 1), 0)
            ident = (st.st_dev, st.st_ino, _read_word(fd, 0))
            for offset in self._written:
                os.pwrite(fd, _WORD.pack(random.getrandbits(64)), offset)
        except OSError as e:
            os.close(fd)
            return self._failed(e)
        self._retire(now)
        self._fd, self._ident = fd, ident
        self._written.clear()
        if not first:
            self._distrust_until = now + DISTRUST_S
            log.warning("%s is not the file this process read (removed, replaced, truncated, zeroed or not "
                        "openable until now): searches read the files for %.0f s", self.path, DISTRUST_S)
        self._trouble = None

    def _failed(self, e: OSError) -> None:
        """The file cannot be used: every read takes the slow path until a later look finds it usable."""
        self._retire(time.monotonic())
        why = errno.errorcode.get(e.errno, str(e.errno))
        if why != self._trouble:
            log.warning("cannot use %s (%s): searches read the files instead of trusting change numbers, and "
                        "it is looked at again every %.1f s", self.path, e.strerror or why, CHECK_S)
        self._trouble = why

    def _retire(self, now: float) -> None:
        # Closed later, not now: a thread that read _fd may not have made its call yet, and a number reused by
        # another open file would take its write.
        if self._fd is not None:
            self._retired.append((self._fd, now))
        self._fd = None

    def _close_retired(self, now: float) -> None:
        while self._retired and now - self._retired[0][1] > RETIRED_S:
            os.close(self._retired.pop(0)[0])

    def _start_timer(self) -> None:
        """(Under the lock.) While a number this process set is not known to be in the file the others read, look
        every CHECK_S, so that even a process that then reads nothing moves within CHECK_S and sets it again."""
        if self._timer_pid != os.getpid():
            self._timer_pid = os.getpid()
            threading.Thread(target=self._look, name="context-mode-signals", daemon=True).start()

    def _look(self) -> None:
        while True:
            time.sleep(CHECK_S)
            self._check(time.monotonic())
            with self._lock:
                if not self._written:
                    self._timer_pid = 0
                    return
