"""The README stays short, and no relative link in README.md or docs/ points to a file that does not exist.

Cheap: files and regular expressions only, no Spark. `mkdocs build --strict` (make test) checks the site's
own links and anchors; this also covers README.md, which the site does not build, and links out of docs/.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150

FENCED = re.compile(r"^( {0,3})(```|~~~).*?^\1\2[^\n]*$", re.M | re.S)
INDENTED_CODE = re.compile(r"^(?: {4}|\t).*$", re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def _generated_pages() -> set[str]:
    """The pages docs/gen_reference.py adds at build time (relative to docs/); importing it imports no Spark."""
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return set(module.GENERATED)


def relative_links(markdown: str) -> list[str]:
    """The targets of the relative links of a Markdown text, outside code."""
    text = INLINE_CODE.sub("", INDENTED_CODE.sub("", FENCED.sub("", markdown)))
    targets = LINK.findall(text) + REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", t, re.I)]


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): "
                                             "move the detail into a page of docs/")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files(path):
    generated = _generated_pages()
    docs = REPO / "docs"
    broken = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if not file:
            continue
        resolved = (path.parent / file).resolve()
        if resolved.exists():
            continue
        if resolved.is_relative_to(docs) and resolved.relative_to(docs).as_posix() in generated:
            continue   # a reference page mkdocs builds from the code
        broken.append(target)
    assert not broken, f"{path.relative_to(REPO)} links to missing files: {broken}"


def test_link_finder_sees_links_and_skips_code():
    text = ("[a](docs/x.md) ![img](pic.png) [web](https://example.org) [anchor](#top)\n"
            "`[not](a.md)`\n\n    [indented](b.md)\n\n```\n[fenced](c.md)\n```\n[ref]: other.md\n")
    assert relative_links(text) == ["docs/x.md", "pic.png", "other.md"]
