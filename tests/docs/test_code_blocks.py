"""Runs every ```python block of README.md and docs/**/*.md as written, offline, each in its own subprocess.

A block that cannot run here (a live server, a GPU, an API key, a fragment of a larger program) is marked in the
markdown with `<!-- not-run: REASON -->` as the last non-blank line before its fence; it is skipped and the reason
is reported. Every other block must exit 0 within the timeout, with no network beyond loopback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.+?)\s*-->$")
BLOCK_TIMEOUT_S = 120


@dataclass(frozen=True)
class CodeBlock:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip_reason: str | None

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def extract_blocks(page: Path) -> list[CodeBlock]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[CodeBlock] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise AssertionError(f"{page.relative_to(ROOT)}:{start + 1}: ```python block is never closed")
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            match = _NOT_RUN.match(lines[k].strip()) if k >= 0 else None
            code = "\n".join(lines[start + 1 : j]) + "\n"
            blocks.append(CodeBlock(page, start + 1, code, match.group(1) if match else None))
            i = j + 1
        else:
            i += 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in extract_blocks(page)]
RUNNABLE = [block for block in ALL_BLOCKS if block.skip_reason is None]

# Runs inside each block's subprocess before the block: refuses any connection that is not loopback, so a block
# that needs the network fails here instead of passing on a machine that has one.
_OFFLINE_GUARD = """
import ipaddress as _ip, socket as _socket
_real_connect = _socket.socket.connect
def _loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else None
    if isinstance(host, str):
        try:
            loop = host == "localhost" or _ip.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            loop = False
        if not loop:
            raise OSError(f"docs code blocks run offline: connection to {host!r} refused")
    return _real_connect(self, address)
_socket.socket.connect = _loopback_only
del _ip
"""


def test_blocks_found_and_skips_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert ALL_BLOCKS, "no ```python blocks found in README.md and docs/"
    assert RUNNABLE, "every docs code block is marked not-run"
    skipped = [block for block in ALL_BLOCKS if block.skip_reason is not None]
    with capsys.disabled():
        print(f"\ndocs code blocks: {len(ALL_BLOCKS)} found, {len(RUNNABLE)} run, {len(skipped)} not run:")
        for block in skipped:
            print(f"  {block.label}: {block.skip_reason}")


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 30)
@pytest.mark.parametrize("block", RUNNABLE, ids=[block.label for block in RUNNABLE])
def test_code_block_runs(block: CodeBlock, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(_OFFLINE_GUARD + "\n" + block.code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    output = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, f"{block.label} failed:\n{block.code}\n{output}"


def test_extract_blocks_reads_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n<!-- not-run: needs a GPU -->\n\n```python\nimport torch\n```\n\n```python\nprint(1)\n```\n",
        encoding="utf-8",
    )
    blocks = extract_blocks(page)
    expected = [(5, "needs a GPU", "import torch\n"), (9, None, "print(1)\n")]
    assert [(b.line, b.skip_reason, b.code) for b in blocks] == expected
