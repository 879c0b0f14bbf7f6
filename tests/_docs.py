"""Read the README and the docs pages the way tests execute them: a section by its heading, a fenced
block in it, the block after a ``<!-- tested: ... -->`` marker. Headings inside code fences (a bash
comment starting with ``#``) are not headings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(```+|~~~+)")
HEADING = re.compile(r"^(#{1,6}) (.*)$")


def doc_text(path: str | Path) -> str:
    """The page's text; ``path`` relative to the repository root (``"README.md"``, ``"docs/guides/x.md"``)."""
    return (ROOT / path).read_text()


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every Markdown heading outside code fences."""
    out, fence = [], None
    for i, line in enumerate(text.splitlines()):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.startswith(fence) and not line[len(fence) :].strip():
                fence = None
            continue
        if fence is None and (h := HEADING.match(line)):
            out.append((i, len(h.group(1)), h.group(2).strip()))
    return out


def doc_section(path: str | Path, heading: str) -> str:
    """The text under ``heading`` (its title, without the ``#``s) up to the next heading of the same or a
    higher level; one such heading must exist."""
    text = doc_text(path)
    lines = text.splitlines(keepends=True)
    found = [(i, level) for i, level, title in headings(text) if title == heading]
    assert len(found) == 1, f"{path}: {len(found)} headings {heading!r}"
    start, level = found[0]
    end = next((i for i, lv, _ in headings(text) if i > start and lv <= level), len(lines))
    return "".join(lines[start:end])


def fenced_blocks(text: str, lang: str) -> list[tuple[str, str]]:
    """(line before the fence, code) of every ```lang block in ``text``, in order."""
    pattern = rf"(?m)^([^\n]*)\n```{re.escape(lang)}\n(.*?)^```[ \t]*$"
    return [(m.group(1).strip(), m.group(2)) for m in re.finditer(pattern, "\n" + text, re.S)]


def doc_block(path: str | Path, heading: str, lang: str = "python", index: int = 0) -> str:
    """The ``index``-th ```lang block under ``heading`` of the page at ``path``, as written."""
    blocks = fenced_blocks(doc_section(path, heading), lang)
    assert len(blocks) > index, f"{path}, {heading!r}: no {lang} block {index}"
    return blocks[index][1]


def block_after_marker(path: str | Path, marker: str, lang: str) -> str:
    """The first ```lang block after the line holding ``marker`` (``<!-- tested: ... -->``)."""
    text = doc_text(path)
    at = text.index(marker)
    return fenced_blocks(text[text.index("\n", at) :], lang)[0][1]


def markdown_pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
