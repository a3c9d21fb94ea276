"""The command line every example's ``train.py`` shares: CPU training, GPU training (``--model``) or ``--dev``."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from examples._training import TrainOutcome, default_run_dir


@dataclass(frozen=True)
class ExampleCommand:
    """One example's entry points and wording for the shared command line."""

    name: str  # runs go to runs/<name>-<timestamp>
    description: str
    metric: str  # what the validation reward measures, e.g. "execution match"
    cpu_steps: int
    train_cpu: Callable[..., TrainOutcome]  # (steps=, seed=, run_dir=, console=)
    train_gpu: Callable[..., TrainOutcome]  # (model, backend=, steps=, seed=, run_dir=, console=)
    dev: Callable[..., Coroutine[Any, Any, Any]]  # (run_dir=, console=): one pass against the fake upstream
    gpu_steps: int = 200

    def parse_args(self, argv: list[str] | None = None) -> argparse.Namespace:
        """Command-line options; GPU options are validated here, before anything is built."""
        return parse_args(self, argv)

    def main(self, argv: list[str] | None = None) -> None:
        """Run the chosen mode and report validation reward before and after."""
        main(self, argv)


def parse_args(command: ExampleCommand, argv: list[str] | None = None) -> argparse.Namespace:
    """``command``'s options; GPU options are validated here, before anything is built."""
    parser = argparse.ArgumentParser(description=command.description)
    parser.add_argument("--dev", action="store_true", help="one pass against a fake upstream; print span trees")
    parser.add_argument("--model", help="GPU mode: a Hugging Face model id or local path to train")
    parser.add_argument("--backend", choices=("torch", "verl"), default="torch", help="GPU mode backend")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps (CPU default {command.cpu_steps}, GPU {command.gpu_steps})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=None, help=f"default: runs/{command.name}-<timestamp>")
    args = parser.parse_args(argv)
    if args.dev and args.model:
        parser.error("--dev runs against the fake upstream; it takes no --model")
    if args.backend == "verl" and not args.model:
        parser.error("--backend verl trains a real model on GPUs: pass --model PATH (the CPU mode uses torch)")
    if args.model and not (Path(args.model).exists() or re.fullmatch(r"[\w.-]+/[\w.-]+", args.model)):
        parser.error(f"--model {args.model!r} is neither a local path nor a Hugging Face id like 'org/name'")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def main(command: ExampleCommand, argv: list[str] | None = None) -> None:
    """Run ``command`` in the chosen mode and report validation reward before and after."""
    args = parse_args(command, argv)
    console = Console()
    run_dir: Path = args.run_dir or default_run_dir(command.name)
    if args.dev:
        asyncio.run(command.dev(run_dir=run_dir, console=console))
        return
    store = run_dir / "store.db"  # kept after the run: `agl store --path` serves it with the dashboard
    if args.model:
        try:
            outcome = command.train_gpu(
                args.model,
                backend=args.backend,
                steps=args.steps or command.gpu_steps,
                seed=args.seed,
                run_dir=run_dir,
                console=console,
            )
        except ValueError as exc:  # e.g. backend verl without verl installed: say so before any work
            raise SystemExit(f"error: {exc}") from exc
    else:
        outcome = command.train_cpu(
            steps=args.steps or command.cpu_steps, seed=args.seed, run_dir=run_dir, console=console, store=str(store)
        )
    curve = write_reward_curve(command, outcome, run_dir)
    console.print(
        f"validation {command.metric} (greedy): {outcome.val_before:.2f} → {outcome.val_after:.2f} after "
        f"{len(outcome.algorithm.history)} steps in {outcome.wall_s:.0f} s; run directory {run_dir}"
    )
    console.print(f"reward curve: {curve}", soft_wrap=True)
    console.print(
        f"rollouts and spans: agl store --path {store}, then open http://127.0.0.1:4747/ (dashboard), "
        f"or agl rollouts --store {store}",
        soft_wrap=True,
    )


def write_reward_curve(command: ExampleCommand, outcome: TrainOutcome, run_dir: Path) -> Path:
    """``run_dir/reward_curve.png``, titled with the example's task and what its reward measures."""
    from agentlightning_trainer import plot_reward_curve

    title = f"LightningRL on the {command.name} example (validation: {command.metric})"
    return plot_reward_curve(
        outcome.algorithm.history, outcome.algorithm.val_history, run_dir / "reward_curve.png", title=title
    )
