"""Markdown and plain-text files cut into context units: `context-mode import` (issue 14, item 5) and the agent
hooks' large tool outputs (issue 27).

Markdown is cut at headings (a section keeps its heading line, so the heading is searchable,
and its heading path goes to metadata); plain text at blank lines. Pieces longer than
``max_chars`` are packed paragraph by paragraph, and a single longer paragraph is cut at
whitespace. Headings inside fenced code blocks are not headings.
"""
from __future__ import annotations

import re
from collections import namedtuple

HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


# line: 1-based line where the chunk starts in the file; section: "Title > Subtitle" for markdown.
# (A named tuple, not a dataclass: the agent hooks import this on every call, and dataclasses costs ~10 ms.)
Chunk = namedtuple("Chunk", ["line", "text", "section"], defaults=[None])


def _paragraphs(lines: list[str], first_line: int) -> list[tuple[int, str]]:
    out, buf, start = [], [], first_line
    for i, line in enumerate(lines):
        if line.strip():
            if not buf:
                start = first_line + i
            buf.append(line)
        elif buf:
            out.append((start, "\n".join(buf)))
            buf = []
    if buf:
        out.append((start, "\n".join(buf)))
    return out


def _cut(text: str, max_chars: int) -> list[str]:
    """A paragraph longer than max_chars, cut at the last whitespace before each limit."""
    pieces = []
    while len(text) > max_chars:
        at = text.rfind(" ", max_chars // 2, max_chars)
        at = max_chars if at <= 0 else at
        pieces.append(text[:at].strip())
        text = text[at:].strip()
    if text:
        pieces.append(text)
    return pieces


def pack(paragraphs: list[tuple[int, str]], max_chars: int) -> list[tuple[int, str]]:
    """Join consecutive paragraphs (blank line between) into pieces of at most max_chars."""
    out: list[tuple[int, str]] = []
    cur: list[str] = []
    cur_start = 0
    for start, para in paragraphs:
        for piece in _cut(para, max_chars):
            size = sum(len(p) + 2 for p in cur) + len(piece)
            if cur and size > max_chars:
                out.append((cur_start, "\n\n".join(cur)))
                cur = []
            if not cur:
                cur_start = start
            cur.append(piece)
    if cur:
        out.append((cur_start, "\n\n".join(cur)))
    return out


def split_text(text: str, max_chars: int = 2000) -> list[Chunk]:
    lines = text.splitlines()
    return [Chunk(line, piece) for line, piece in pack(_paragraphs(lines, 1), max_chars)]


def split_markdown(text: str, max_chars: int = 2000) -> list[Chunk]:
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []       # (level, title) of the enclosing headings
    section: list[str] = []
    start = 1
    in_fence = False

    def flush():
        title = " > ".join(t for _, t in path) or None
        for line, piece in pack(_paragraphs(section, start), max_chars):
            chunks.append(Chunk(line, piece, title))

    for i, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
        m = None if in_fence else HEADING.match(line)
        if m:
            flush()
            level = len(m.group(1))
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, m.group(2)))
            section, start = [], i
        section.append(line)
    flush()
    return chunks
