"""LightningRL's algorithm settings, per example and seed (not a test): what each option does to learning.

Run: ``.venv/bin/python -m bench.rl_settings`` (3 seeds; ``--quick``: seed 0, tool choice, its first two variants;
``--examples rag``; ``--variants default "rollout-mean"``).

* ``tool_choice`` — the quickstart task in process (one call per rollout): mean train reward of steps 91-100.
* ``rag`` — the multi-hop research agent through the full HTTP loop (two calls per rollout, ``per_call`` credit with
  step rewards: where tied groups made the old advantages explode): greedy validation F1 after 15 steps.
* ``calc`` — the AutoGen calculator agent through the full HTTP loop (two tool turns, the second prompt extending the
  first): greedy validation exact answer after 40 steps, trained per trajectory (its default) and per call.

``before #25`` reproduces the advantages the trainer used before issue 25 (call deviations divided by the std of the
rollout scores; unbounded for a tied group with per-call credit; kept here only as the baseline). It equals today's
on single-call rollouts and under ``identical`` credit (tool choice; calc, whose only reward is final), so it runs
on rag only. Every other row is today's trainer with one option changed from the example's default. The rows are what
the defaults in ``LightningRLConfig`` were chosen from (docs/algorithm.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import agentlightning.adapter
from agentlightning.adapter._rows import with_updates
from agentlightning.types import Transition
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import train_in_process

KNOBS: dict[str, dict[str, Any]] = {
    "default": {},
    "drop_tied_groups": {"drop_tied_groups": True},
    "rollout-mean": {"loss_aggregation": "rollout-mean"},
    "entropy_coef 0.01": {"entropy_coef": 0.01},
    "clip_ratio_c 3": {"clip_ratio_c": 3.0},
    "tis_cap 2": {"tis_cap": 2.0},
}
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "tool_choice": KNOBS,
    "rag": {"before #25": {}, **{k: KNOBS[k] for k in ("default", "drop_tied_groups", "rollout-mean")}},
    "calc": {"default (trajectory)": {}, "transitions call": {"transitions": "call"}},
}


def pre_issue25_grpo_advantages(
    transitions: Sequence[Transition], *, normalize_std: bool = True, epsilon: float = 1e-6
) -> list[Transition]:
    """The advantages before issue 25: each call's deviation from its rollout's score over the std of the scores."""
    by_rollout: dict[str, list[float]] = {}
    group_of: dict[str, str] = {}
    for t in transitions:
        by_rollout.setdefault(t.rollout_id, []).append(t.reward)
        group_of[t.rollout_id] = t.group_id
    score = {rid: sum(v) / len(v) for rid, v in by_rollout.items()}
    groups: dict[str, list[float]] = {}
    for rid, group in group_of.items():
        groups.setdefault(group, []).append(score[rid])
    stats: dict[str, tuple[float, float]] = {}
    for group, scores in groups.items():
        if len(scores) == 1:
            stats[group] = (0.0, 1.0)
            continue
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
        stats[group] = (mean, std + epsilon if normalize_std else 1.0)
    return [
        with_updates(t, {"advantage": (t.reward - stats[t.group_id][0]) / stats[t.group_id][1]}) for t in transitions
    ]


@contextlib.contextmanager
def advantages_of(variant: str) -> Iterator[None]:
    """Swap in the pre-#25 advantages for the ``before #25`` variant (the trainer imports them at each update)."""
    if variant != "before #25":
        yield
        return
    today = agentlightning.adapter.grpo_advantages
    agentlightning.adapter.grpo_advantages = pre_issue25_grpo_advantages  # type: ignore[assignment]  # same signature
    try:
        yield
    finally:
        agentlightning.adapter.grpo_advantages = today


@dataclass
class Result:
    """One run: the figure the example is judged by, the largest |advantage| seen, and the wall time."""

    value: float
    max_abs_advantage: float
    seconds: float


def _max_advantage_probe() -> tuple[Callable[[], float], contextlib.AbstractContextManager[None]]:
    """Record the largest |advantage| of every update in this process (wraps the learner's update)."""
    from agentlightning_trainer.torch_backend.learner import TorchLearner

    seen = [0.0]
    original = TorchLearner.update

    def update(self: TorchLearner, transitions: Sequence[Transition]) -> dict[str, float]:
        for t in transitions:
            values = t.response_advantages or [t.advantage or 0.0]
            seen[0] = max(seen[0], max(abs(v) for v in values))
        return original(self, transitions)

    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        TorchLearner.update = update  # type: ignore[method-assign]  # a measuring wrapper, restored below
        try:
            yield
        finally:
            TorchLearner.update = original  # type: ignore[method-assign]

    return (lambda: seen[0]), patched()


def tool_choice_run(overrides: dict[str, Any], variant: str, seed: int) -> Result:
    """Mean train reward of steps 91-100 in process."""
    config = LightningRLConfig.model_validate(
        {
            "policy": PolicySpec(words=tool_choice.vocabulary()),
            "steps": 100,
            "seed": seed,
            "val_every": 10_000,
            **overrides,
        }
    )
    peak, probe = _max_advantage_probe()
    start = time.perf_counter()
    with advantages_of(variant), probe:
        result = train_in_process(
            config, tool_choice.tasks(), None, messages=tool_choice.messages, score=tool_choice.score
        )
    late = [m.reward_mean for m in result.history[-10:]]
    return Result(sum(late) / len(late), peak(), time.perf_counter() - start)


def _http_run(example: str, config: LightningRLConfig, variant: str) -> Result:
    """Greedy validation reward at the end of an example's CPU run through the HTTP loop."""
    from examples import _training

    if example == "rag":
        from examples.rag import train as module

        agent, instrumentation, (train, val) = module.rag_agent, module.agentlightning_openai_agents, module.cpu_tasks()
        n_runners = 96
    else:
        from examples.calc import train as module

        agent, instrumentation, (train, val) = module.calc_agent, module.agentlightning_autogen, module.cpu_tasks()
        n_runners = 64
    peak, probe = _max_advantage_probe()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp, advantages_of(variant), probe:
        outcome = _training.fit(
            config.model_copy(update={"checkpoint_dir": None, "log_dir": None}),
            agent,
            train,
            val,
            instrumentation=instrumentation,
            run_dir=Path(tmp),
            n_runners=n_runners,
            show_progress=False,
        )
    return Result(outcome.val_after, peak(), time.perf_counter() - start)


def rag_run(overrides: dict[str, Any], variant: str, seed: int) -> Result:
    """Greedy validation F1 after 15 steps of the rag example."""
    from examples.rag import train as rag

    config = LightningRLConfig.model_validate({**rag.cpu_config(15, seed).model_dump(), **overrides})
    return _http_run("rag", config, variant)


def calc_run(overrides: dict[str, Any], variant: str, seed: int) -> Result:
    """Greedy validation exact answer after 40 steps of the calc example."""
    from examples.calc import train as calc

    config = LightningRLConfig.model_validate({**calc.cpu_config(40, seed).model_dump(), **overrides})
    return _http_run("calc", config, variant)


EXAMPLES: dict[str, tuple[str, Callable[[dict[str, Any], str, int], Result]]] = {
    "tool_choice": ("mean train reward, steps 91-100", tool_choice_run),
    "rag": ("validation F1 after 15 steps", rag_run),
    "calc": ("validation exact answer after 40 steps", calc_run),
}


def main() -> None:
    """Run every variant of every chosen example over the seeds; print one table per example."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="seed 0, the tool-choice task, two variants")
    parser.add_argument("--examples", nargs="*", default=None, choices=sorted(EXAMPLES))
    parser.add_argument("--variants", nargs="*", default=None, help="only these variants (names as in the tables)")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    console = Console()
    seeds = [0] if args.quick else list(range(args.seeds))
    examples = args.examples or (["tool_choice"] if args.quick else list(EXAMPLES))
    for example in examples:
        label, run = EXAMPLES[example]
        table = Table(title=f"{example}: {label} (higher is better), per seed; max |advantage| over the run")
        for column in ("variant", *[f"seed {s}" for s in seeds], "median", "max |A|", "wall s"):
            table.add_column(column)
        variants = VARIANTS[example]
        chosen = [v for v in variants if args.variants is None or v in args.variants]
        if args.quick and args.variants is None:
            chosen = chosen[:2]  # the suite's budget (bench/__main__.py): the default and one option
        for variant in chosen:
            results = [run(variants[variant], variant, seed) for seed in seeds]
            for seed, result in zip(seeds, results, strict=True):
                console.print(f"{example} / {variant} / seed {seed}: {result.value:.3g} ({result.seconds:.0f} s)")
            table.add_row(
                variant, *[f"{r.value:.3g}" for r in results], f"{statistics.median(r.value for r in results):.3g}",
                f"{max(r.max_abs_advantage for r in results):.3g}", f"{sum(r.seconds for r in results):.0f}",
            )  # fmt: skip
        console.print(table)


if __name__ == "__main__":
    main()
