"""Markdown and text files cut into units for `context-mode import` (clients/python/context_mode_client/textsplit.py)."""
import pytest

from context_mode_client.textsplit import split_markdown, split_text


def test_markdown_sections_keep_their_heading_and_path():
    text = "preface\n\n# A\n\nalpha\n\n## A.1 ##\n\none\n\n### deep\n\nd\n\n# B\n\nbeta\n"
    got = [(c.line, c.section, c.text) for c in split_markdown(text)]
    assert got == [(1, None, "preface"), (3, "A", "# A\n\nalpha"), (7, "A > A.1", "## A.1 ##\n\none"),
                   (11, "A > A.1 > deep", "### deep\n\nd"), (15, "B", "# B\n\nbeta")]


def test_headings_inside_code_fences_are_text():
    text = "# Real\n\n```python\n# comment, not a heading\nx = 1\n```\n\n~~~\n## nor this\n~~~\n"
    [chunk] = split_markdown(text)
    assert chunk.section == "Real" and "# comment, not a heading" in chunk.text and "## nor this" in chunk.text


def test_not_headings():
    assert [c.section for c in split_markdown("#hashtag\n\n    # indented code\n")] == [None]


def test_long_sections_are_packed_by_paragraph_then_cut_at_whitespace():
    paragraphs = ["p%d " % i + "word " * 30 for i in range(10)]         # ~155 characters each
    chunks = split_text("\n\n".join(paragraphs), max_chars=400)
    assert all(len(c.text) <= 400 for c in chunks) and len(chunks) == 5
    assert [c.line for c in chunks] == [1, 5, 9, 13, 17]
    one = split_text("x" * 50 + " " + "y" * 500, max_chars=200)
    assert all(len(c.text) <= 200 for c in one) and "".join(c.text for c in one).replace(" ", "") == \
        "x" * 50 + "y" * 500


@pytest.mark.parametrize("text", ["", "\n\n  \n", "# only a heading"])
def test_empty_and_tiny_inputs(text):
    chunks = split_markdown(text)
    assert all(c.text.strip() for c in chunks)
    assert len(chunks) == (1 if text.strip() else 0)
