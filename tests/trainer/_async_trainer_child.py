"""A trainer process for the kill -9 test: async LightningRL on a SQLite store, a checkpoint after every step.

``python -m tests.trainer._async_trainer_child STORE RUN_DIR CHECKPOINT_DIR STEPS``; the runners are other processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentlightning.trainer import Trainer
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL


def config(checkpoint_dir: Path, steps: int) -> LightningRLConfig:
    """The run both the killed trainer and its successor use."""
    return LightningRLConfig(
        policy=PolicySpec(words=tool_choice.vocabulary()), steps=steps, tasks_per_step=2, samples_per_task=2,
        mode="async", max_staleness=1, checkpoint_dir=checkpoint_dir, checkpoint_every=1, val_every=100,
        rollout_heartbeat_timeout_s=2.0, rollout_max_attempts=3,
    )  # fmt: skip


def main() -> None:
    """Train until killed (or done)."""
    store, run_dir, checkpoint_dir, steps = sys.argv[1:5]
    algorithm = LightningRL(config(Path(checkpoint_dir), int(steps)), run_dir=Path(run_dir), show_progress=False)
    Trainer(algorithm, store=store, role="algorithm").fit(None, tool_choice.tasks())


if __name__ == "__main__":
    main()
