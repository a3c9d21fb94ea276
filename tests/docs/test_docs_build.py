"""The docs site builds offline with `mkdocs build --strict`, so a broken API reference or link fails the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    # Each API reference page rendered the objects it names (mkdocstrings gives each one an anchor).
    store_page = (site / "reference" / "store" / "index.html").read_text(encoding="utf-8")
    assert 'id="agentlightning.store.LightningStore"' in store_page
    rl_page = (site / "reference" / "lightning_rl" / "index.html").read_text(encoding="utf-8")
    assert 'id="agentlightning_trainer.config.LightningRLConfig"' in rl_page
    assert (site / "config" / "index.html").exists()
