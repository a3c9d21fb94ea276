"""Each bring-your-own-agent page's rollout function runs as written under `agl dev --fake` (the real CLI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# page -> module name the page tells the reader to save its first ```python block as
PAGES = {
    "openai_client.md": "my_agent",
    "langgraph.md": "my_graph",
    "autogen.md": "my_autogen",
    "openai_agents.md": "my_sdk_agent",
}


def first_python_block(page: Path) -> str:
    lines = page.read_text(encoding="utf-8").splitlines()
    start = lines.index("```python") + 1
    end = lines.index("```", start)
    return "\n".join(lines[start:end]) + "\n"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_agent_runs_under_agl_dev(page: str, tmp_path: Path) -> None:
    module = PAGES[page]
    (tmp_path / f"{module}.py").write_text(first_python_block(ROOT / "docs" / "agents" / page), encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"q": "Say 4", "a": "4"}\n', encoding="utf-8")
    agl = shutil.which("agl", path=str(Path(sys.executable).parent)) or "agl"
    result = subprocess.run(
        [agl, "dev", "--agent", f"{module}:agent", "--tasks", "tasks.jsonl", "--fake"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=150,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "succeeded" in output, output
