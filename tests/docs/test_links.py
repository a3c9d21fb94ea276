"""Every relative link in README.md and docs/*.md resolves to a file inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) and [text]: target; images too. Code spans and fenced blocks are removed first.
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(text: str) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    targets = _INLINE.findall(text) + _REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_pages_found() -> None:
    assert (ROOT / "README.md").exists()
    assert len(PAGES) > 5


def test_relative_links_resolve_inside_repository() -> None:
    broken: list[str] = []
    for page in PAGES:
        for target in relative_links(page.read_text(encoding="utf-8")):
            path_part = target.split("#", 1)[0]
            if not path_part:
                continue
            resolved = (page.parent / path_part).resolve()
            where = f"{page.relative_to(ROOT)} -> {target}"
            if not resolved.is_relative_to(ROOT):
                broken.append(f"{where} (outside the repository)")
            elif not resolved.exists():
                broken.append(f"{where} (no such file)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_extraction() -> None:
    text = "see [a](docs/x.md#s), [b](https://e.com), `[c](no.md)`, [d](#top)\n[e]: ../y.md\n"
    assert relative_links(text) == ["docs/x.md#s", "../y.md"]
