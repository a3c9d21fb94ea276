"""docs/config.md is the generated configuration reference; it must match the pydantic models' fields."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_config_reference.py"


def test_config_reference_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_config_reference_lists_every_field() -> None:
    from agentlightning_trainer.config import LightningRLConfig, PolicySpec

    page = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    for model in (LightningRLConfig, PolicySpec):
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in page, f"{model.__name__}.{name} missing from docs/config.md"
            assert field.description, f"{model.__name__}.{name} has no description"
