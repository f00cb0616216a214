"""The project's own documents describe the interface: every file they point to is inside the
repository, and docs/interface.md names every error code the gateway can answer with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.errors import ERROR_TABLE

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Markdown links, and file names in backticks ending in .md: both are where a reader is sent.
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)|`([^`\s]+\.md)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_documents_point_only_inside_the_repository(doc: Path) -> None:
    for match in LINK.finditer(doc.read_text(encoding="utf-8")):
        target = match.group(1) or match.group(2)
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        resolved = (doc.parent / target).resolve()
        bases = [doc.parent.resolve(), ROOT] if match.group(2) else [doc.parent.resolve()]
        found = [b for b in bases if (b / target).resolve().exists()]
        assert resolved.is_relative_to(ROOT), f"{doc.name} points outside the repository: {target}"
        assert found, f"{doc.name} points to a file that does not exist: {target}"


def test_readme_links_the_interface_document() -> None:
    assert "](docs/interface.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_interface_document_lists_every_error_code_with_its_status_and_type() -> None:
    text = (ROOT / "docs" / "interface.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    for code, (status, type_) in ERROR_TABLE.items():
        listed = [r for r in rows if f"| `{code}` |" in r]
        assert listed, f"docs/interface.md has no row for {code}"
        # A code may have rows for several statuses (timeout: 408 and 504); one has the default.
        assert any(str(status) in r.split("|")[1] and f"`{type_}`" in r for r in listed), listed
