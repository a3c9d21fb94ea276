"""What an example's command line leaves behind: its SQLite store under the run directory and a titled reward curve."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

from agentlightning.store.sqlite import SqliteLightningStore

REPO = Path(__file__).resolve().parents[2]


def test_an_example_run_keeps_its_store_and_writes_a_titled_curve(tmp_path: Path) -> None:
    run_dir = tmp_path / "calc"
    done = subprocess.run(
        [sys.executable, "-m", "examples.calc.train", "--steps", "1", "--run-dir", str(run_dir)],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    store_path = run_dir / "store.db"
    assert f"agl store --path {store_path}" in done.stdout  # how to open it in the dashboard

    async def statuses() -> set[str]:
        store = SqliteLightningStore(store_path)
        try:
            return {rollout.status for rollout in await store.query_rollouts()}
        finally:
            await store.close()

    assert "succeeded" in asyncio.run(statuses())
    with Image.open(run_dir / "reward_curve.png") as png:
        assert png.info["Title"] == "LightningRL on the calc example (validation: exact answer)"
