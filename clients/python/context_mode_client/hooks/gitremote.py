"""A repository's identity for the agent hooks' project keys (issue 50 I4): the address of its remote
``origin``, so that ``/app`` on two machines holding two repositories are two projects, and one repository
checked out anywhere is one.

The address is read from the repository's own config file, never by running git (a hook runs in whatever
directory an agent is in: nothing of that repository is executed, no ``include`` is followed, and only regular
files of at most 1 MiB are read), then normalised so that every way of writing one repository's address gives
one identity: ``https://user:token@GitHub.com:443/acme/shop.git/``, ``git@github.com:acme/shop.git`` and
``ssh://git@github.com/acme/shop`` are all ``github.com/acme/shop`` (no credentials, no port, no ``.git``,
the host in lower case). A remote that is a local path has no identity: it names a place on one machine.
"""
from __future__ import annotations

import os
import re
import stat

MAX_FILE_BYTES = 1 << 20
_SECTION = re.compile(r'\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\\n]|\\.)*)")?\s*\]')
_KEY = re.compile(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?$")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.S)
_SCP = re.compile(r"([^/:]+):(.*)", re.S)                # git's rule: a colon before any slash
_ESCAPES = {"n": "\n", "t": "\t", "b": "\b", "\\": "\\", '"': '"'}


def _read(path: str) -> str | None:
    """A small regular file's text (None for anything else: a FIFO or a device would hold the hook)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return None
        return os.read(fd, MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def config_file(root: str) -> str | None:
    """The config file of the repository whose work tree is ``root``: ``.git/config``, or, where ``.git`` is a
    file (``gitdir: …``: a worktree or a submodule), the config of the directory it names (a worktree's
    ``commondir``: the main repository's)."""
    dot = os.path.join(root, ".git")
    if os.path.isdir(dot):
        return os.path.join(dot, "config")
    text = _read(dot)
    if not text or not text.startswith("gitdir:"):
        return None
    gitdir = os.path.join(root, text[len("gitdir:"):].strip())        # (an absolute one stays as it is)
    common = _read(os.path.join(gitdir, "commondir"))
    if common and common.strip():
        gitdir = os.path.join(gitdir, common.strip())
    return os.path.join(gitdir, "config")


def _value(raw: str) -> str:
    """A git config value: quotes removed, escapes read, a comment (``#``, ``;`` outside quotes) and the
    surrounding white space dropped."""
    out, quoted, pending = [], False, ""
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "\\" and i + 1 < len(raw):
            out.append(pending + _ESCAPES.get(raw[i + 1], raw[i + 1]))
            pending, i = "", i + 2
            continue
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "#;":
            break
        elif not quoted and c.isspace():
            pending += c if out else ""
        else:
            out.append(pending + c)
            pending = ""
        i += 1
    return "".join(out)


def origin_url(root: str) -> str | None:
    """The first ``url`` of ``[remote "origin"]`` in the repository's config, as written (None without one)."""
    path = config_file(root)
    text = _read(path) if path else None
    if not text:
        return None
    in_origin = False
    lines = iter(text.replace("\\\r\n", "").replace("\\\n", "").splitlines())   # (continued lines joined)
    for line in lines:
        section = _SECTION.match(line)
        if section:
            name, sub = section.group(1).lower(), section.group(2)
            in_origin = (name, sub) == ("remote", "origin") or (sub is None and name == "remote.origin")
            line = line[section.end():]
        if not in_origin:
            continue
        key = _KEY.match(line)
        if key and key.group(1).lower() == "url" and key.group(2) is not None:
            return _value(key.group(2)) or None
    return None


def normalise(url: str) -> str | None:
    """``host/path`` of a remote's address, the same for each way of writing it; None for a local path."""
    url = url.strip()
    scheme = _SCHEME.fullmatch(url)
    if scheme:
        if scheme.group(1).lower() == "file":
            return None
        authority, _, path = scheme.group(2).partition("/")
        path = re.split(r"[?#]", path, maxsplit=1)[0]
    else:
        scp = _SCP.fullmatch(url)
        if not scp or re.fullmatch(r"[A-Za-z]", scp.group(1)):      # (C:\repo is a path)
            return None
        authority, path = scp.group(1), scp.group(2)
    host = authority.rpartition("@")[2]                       # no user, no password
    if host.startswith("["):                                  # [::1]:22
        host = host[1:].partition("]")[0]
    else:
        host, _, port = host.partition(":")
        if port and not port.isdigit():                       # ssh://git@host:acme/shop: a path, not a port
            path = f"{port}/{path}"
    host = host.lower().rstrip(".")
    path = re.sub(r"/+", "/", path).strip("/")
    if path.endswith(".git"):
        path = path[:-len(".git")].rstrip("/")
    return f"{host}/{path}" if host and path else None


def identity(root: str) -> str | None:
    """The repository at ``root`` as ``host/path`` of its ``origin``; None without a remote one."""
    url = origin_url(root)
    return normalise(url) if url else None
