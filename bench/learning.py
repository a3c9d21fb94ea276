"""Learning benchmark (not a test): wall time and steps until the train reward EMA reaches 0.8 on the tool-choice task.

Run: ``.venv/bin/python -m bench.learning`` (``--quick`` for one seed). Two loops, median of 3 seeds each:

* in-process — the policy samples directly, no store, no HTTP (the CI path);
* full HTTP — runners execute the unmodified OpenAI-SDK agent, which calls the LLM proxy, which forwards to the
  policy server process and records spans with token ids into a SQLite store; LightningRL adapts, updates and
  hot-swaps the weights (the ``make train`` path). Target: <= 3 minutes on this machine.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from agentlightning.trainer import Trainer
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import train_in_process
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.quickstart.agent import tool_choice_agent

THRESHOLD = 0.8
TARGET_HTTP_S = 180.0


def _config(seed: int, max_steps: int, **overrides: object) -> LightningRLConfig:
    return LightningRLConfig.model_validate(
        {
            "policy": PolicySpec(words=tool_choice.vocabulary()),
            "steps": max_steps,
            "seed": seed,
            "val_every": 10_000,
            "stop_at_reward": THRESHOLD,
            **overrides,
        }
    )


def in_process(seed: int, max_steps: int) -> tuple[float, int | None]:
    """(seconds, steps) to reward EMA 0.8 without HTTP."""
    started = time.perf_counter()
    result = train_in_process(
        _config(seed, max_steps), tool_choice.tasks(), None, messages=tool_choice.messages, score=tool_choice.score
    )
    return time.perf_counter() - started, result.steps_to(THRESHOLD)


def full_http(seed: int, max_steps: int, epochs: int) -> tuple[float, int | None]:
    """(seconds, steps) to reward EMA 0.8 through runner → proxy → policy server, SQLite store, policy server start."""
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp:
        algorithm = LightningRL(_config(seed, max_steps, epochs=epochs), run_dir=Path(tmp), show_progress=False)
        started = time.perf_counter()
        Trainer(algorithm, store=Path(tmp) / "store.db", n_runners=48).fit(tool_choice_agent, tool_choice.tasks())
        elapsed = time.perf_counter() - started
    reached = next((m.step for m in algorithm.history if m.reward_ema >= THRESHOLD), None)
    return elapsed, reached


def main() -> None:
    """Run both loops over the seeds and print medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one seed instead of three")
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--http-epochs", type=int, default=2, help="epochs per step of the HTTP loop (quickstart: 2)")
    parser.add_argument("--skip-http", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    console = Console()
    seeds = [0] if args.quick else [0, 1, 2]
    loops = {"in-process (GRPO, 1 epoch)": lambda s: in_process(s, args.max_steps)}
    if not args.skip_http:
        loops[f"full HTTP (GRPO, {args.http_epochs} epochs)"] = lambda s: full_http(s, args.max_steps, args.http_epochs)
    table = Table(title=f"steps and wall time to train reward EMA >= {THRESHOLD} (tool choice)")
    for column in ("loop", "seed", "steps", "seconds"):
        table.add_column(column)
    for name, run in loops.items():
        times: list[float] = []
        steps: list[int] = []
        for seed in seeds:
            seconds, reached = run(seed)
            console.print(f"{name} seed {seed}: {reached} steps, {seconds:.1f} s")
            table.add_row(name, str(seed), str(reached), f"{seconds:.1f}")
            times.append(seconds if reached is not None else float("inf"))
            steps.append(reached if reached is not None else 10**9)
        med_t, med_s = statistics.median(times), statistics.median(steps)
        table.add_row(f"[bold]{name} median", "-", str(med_s), f"[bold]{med_t:.1f}")
    console.print(table)
    console.print(f"target for the full HTTP loop: <= {TARGET_HTTP_S:.0f} s")


if __name__ == "__main__":
    main()
