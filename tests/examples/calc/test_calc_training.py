"""CI runs the calc example's CPU mode with a step budget: validation reward must rise by at least 0.3."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.calc.train import train_cpu


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpu_mode_learns_the_calculation(tmp_path: Path) -> None:
    outcome = train_cpu(steps=40, seed=0, run_dir=tmp_path, show_progress=False)
    print(f"calc: validation {outcome.val_before:.2f} -> {outcome.val_after:.2f} in {outcome.wall_s:.0f} s")
    assert outcome.val_after - outcome.val_before >= 0.3
