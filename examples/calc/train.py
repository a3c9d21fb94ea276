"""Train the calc agent of ``agent.py`` with Agent Lightning. This file is the only one that knows Agent Lightning.

The wiring is three things: ``agentlightning_autogen.instrument()`` (records AutoGen's agent and tool spans and every
model call), a ``@rollout`` function that runs the unmodified agent with the rollout's model and returns 1 for the
exact answer, and ``Trainer.fit`` with LightningRL.

    python -m examples.calc.train                  # CPU: the tiny GPT learns the reduced task (~1-2 min)
    python -m examples.calc.train --dev            # one pass against a fake upstream; span trees printed
    python -m examples.calc.train --model Qwen/Qwen2.5-1.5B-Instruct --backend verl   # GPU
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rich.console import Console

import agentlightning_autogen
from agentlightning import LLM, Trainer, rollout
from agentlightning.store.base import LightningStore
from agentlightning_trainer import LightningRL, LightningRLConfig, PolicySpec
from examples.calc import problems
from examples.calc.agent import SYSTEM_MESSAGE, solve

# Every calculation the templates need, written with the problem's numbers as first and second.
EXPRESSIONS: Final = tuple(dict.fromkeys(expression for _, expression in problems.TEMPLATES))


def exact_answer(answer: str, expected: float) -> float:
    """1.0 when the agent's final answer is the expected number, else 0.0 (a calculator error is wrong)."""
    try:
        return 1.0 if abs(float(answer.strip()) - expected) < 1e-9 else 0.0
    except ValueError:
        return 0.0


@rollout(name="calc-agent")
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve one word problem with the unmodified agent and the rollout's model; reward = exact answer."""
    answer = await solve(
        task["problem"],
        base_url=llm.base_url,
        model=llm.model,
        temperature=float(llm.sampling.get("temperature", 0.0)),
        max_tokens=int(llm.sampling.get("max_tokens", 64)),
    )
    return exact_answer(answer, float(task["answer"]))


def vocabulary() -> tuple[str, ...]:
    """Whole-word tokens of the tiny GPT: every word of the instructions and templates, plus one token per
    calculation the templates need (as the quickstart's tool names: a random policy can hit one)."""
    texts = [SYSTEM_MESSAGE, *(template for template, _ in problems.TEMPLATES), *problems.NAMES, *problems.THINGS]
    words: dict[str, None] = dict.fromkeys(EXPRESSIONS)
    for word in re.findall(r"[a-z]+", " ".join(texts)):
        if len(word) > 1:
            words.setdefault(word)
    return tuple(words)


def cpu_tasks(seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training problems and held-out validation problems (same templates, other names, objects and numbers)."""
    train, val = problems.train_val(n_train=8, n_val=2, seed=seed)
    return [p.as_task() for p in train], [p.as_task() for p in val]


def cpu_config(steps: int = 40, seed: int = 0, run_dir: Path | None = None) -> LightningRLConfig:
    """The CPU settings: the tiny GPT with this example's words, batches sized for a 2-core machine."""
    return LightningRLConfig(
        policy=PolicySpec(words=vocabulary(), max_seq_len=128),
        steps=steps,
        seed=seed,
        tasks_per_step=8,
        samples_per_task=16,
        # Rollouts cost far more than updates: squeeze each batch with two passes in mini-batches of 32.
        epochs=2,
        mini_batch_size=32,
        max_prompt_tokens=100,
        max_response_tokens=6,
        val_every=10,
        checkpoint_dir=None if run_dir is None else run_dir / "checkpoints",
        log_dir=None if run_dir is None else run_dir / "tensorboard",
    )


def gpu_config(model: str, *, backend: str, steps: int, seed: int = 0, run_dir: Path) -> LightningRLConfig:
    """Settings for a Hugging Face model on a GPU (validated here; running them needs the GPU)."""
    return LightningRLConfig(
        backend=backend,  # type: ignore[arg-type]  # validated by parse_args and by the config itself
        policy=PolicySpec(kind="hf", hf_model=model, model_name=Path(model).name or model),
        steps=steps,
        seed=seed,
        tasks_per_step=16,
        samples_per_task=8 if backend == "verl" else 16,
        lr=1e-6,
        max_prompt_tokens=512,
        max_response_tokens=64,
        checkpoint_dir=None if backend == "verl" else run_dir / "checkpoints",
    )


@dataclass
class TrainOutcome:
    """What a training run produced."""

    algorithm: LightningRL
    store: LightningStore
    val_before: float
    val_after: float
    wall_s: float


def train(
    config: LightningRLConfig,
    *,
    train_tasks: list[dict[str, Any]],
    val_tasks: list[dict[str, Any]],
    run_dir: Path,
    store: LightningStore | str = ":memory:",
    n_runners: int = 64,
    show_progress: bool = True,
    console: Console | None = None,
) -> TrainOutcome:
    """Fit the agent with LightningRL (torch backend, or verl when configured); report validation reward."""
    from agentlightning.trainer import open_store

    console = console or Console()
    kwargs: dict[str, Any] = {"run_dir": run_dir, "console": console, "show_progress": show_progress}
    if config.backend == "verl":
        from agentlightning_trainer.verl import VerlLightningRL

        algorithm: LightningRL = VerlLightningRL(config, **kwargs)
    else:
        algorithm = LightningRL(config, **kwargs)
    opened = open_store(store)
    agentlightning_autogen.instrument()
    started = time.perf_counter()
    try:
        Trainer(algorithm, store=opened, n_runners=n_runners, console=console).fit(calc_agent, train_tasks, val_tasks)
    finally:
        agentlightning_autogen.uninstrument()
    val = algorithm.val_history
    return TrainOutcome(
        algorithm=algorithm,
        store=opened,
        val_before=val[0][1] if val else float("nan"),
        val_after=val[-1][1] if val else float("nan"),
        wall_s=time.perf_counter() - started,
    )


def train_cpu(
    steps: int = 40, seed: int = 0, run_dir: Path | None = None, console: Console | None = None, **options: Any
) -> TrainOutcome:
    """Train the tiny GPT on the CPU task; validation (greedy) runs on held-out problems."""
    import torch

    torch.set_num_threads(1)  # the policy server, the agents and the learner share two cores
    run_dir = run_dir or Path("runs") / time.strftime("calc-%Y%m%d-%H%M%S")
    train_tasks, val_tasks = cpu_tasks(seed)
    config = cpu_config(steps, seed, run_dir)
    return train(
        config, train_tasks=train_tasks, val_tasks=val_tasks, run_dir=run_dir, console=console, **options
    )  # fmt: skip


def scripted_upstream(expressions: dict[str, str]) -> Any:
    """The fake upstream's scripted solver: the right calculation for each problem, in words."""
    from agentlightning.testing.fake_openai import FakeReply, FakeRequest

    def reply(request: FakeRequest) -> FakeReply:
        return FakeReply(text=expressions.get(request.last_user_text, "first plus second"))

    return reply


async def dev_async(n_tasks: int = 2, console: Console | None = None) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` problems once against the fake upstream through the LLM proxy; print each span tree."""
    from agentlightning.proxy import flush_proxy_spans
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.testing.fake_openai import FakeOpenAI
    from examples.rag.span_tree import print_span_trees, proxy_on_loop

    console = console or Console()
    train_tasks, _ = cpu_tasks()
    tasks = train_tasks[:n_tasks]
    store = InMemoryLightningStore()
    agentlightning_autogen.instrument()
    try:
        upstream_reply = scripted_upstream({t["problem"]: t["expression"] for t in train_tasks})
        with FakeOpenAI(reply=upstream_reply).serve() as upstream:
            async with proxy_on_loop(store, upstream.base_url) as (proxy_url, proxy_app):
                await store.add_resources({"llm": LLM(base_url=proxy_url, model="fake", proxied=True)})
                rows = await Trainer(store=store, n_runners=2, console=console).dev_async(
                    calc_agent, tasks, timeout_s=60
                )
                await flush_proxy_spans(proxy_app)
                trees = await print_span_trees(store, [r.rollout_id for r in rows], console)
    finally:
        agentlightning_autogen.uninstrument()
    return rows, trees


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; GPU options are validated here, before anything is built."""
    parser = argparse.ArgumentParser(description="Train the AutoGen calculator agent with LightningRL.")
    parser.add_argument("--dev", action="store_true", help="one pass against a fake upstream; print span trees")
    parser.add_argument("--model", help="GPU mode: a Hugging Face model id or local path to train")
    parser.add_argument("--backend", choices=("torch", "verl"), default="torch", help="GPU mode backend")
    parser.add_argument("--steps", type=int, default=None, help="training steps (CPU default 40, GPU 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: runs/calc-<timestamp>")
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


def main(argv: list[str] | None = None) -> None:
    """Run the chosen mode and report validation reward before and after."""
    args = parse_args(argv)
    console = Console()
    run_dir: Path = args.run_dir or Path("runs") / time.strftime("calc-%Y%m%d-%H%M%S")
    if args.dev:
        asyncio.run(dev_async(console=console))
        return
    if args.model:
        try:
            config = gpu_config(
                args.model, backend=args.backend, steps=args.steps or 200, seed=args.seed, run_dir=run_dir
            )
        except ValueError as exc:  # e.g. backend verl without verl installed: say so before any work
            raise SystemExit(f"error: {exc}") from exc
        train_tasks, val_tasks = (
            [p.as_task() for p in problems.problems(50, seed=args.seed)],
            [p.as_task() for p in problems.problems(10, seed=args.seed + 1000)],
        )
        outcome = train(
            config, train_tasks=train_tasks, val_tasks=val_tasks, run_dir=run_dir, store=str(run_dir / "store.db"),
            console=console,
        )  # fmt: skip
    else:
        outcome = train_cpu(steps=args.steps or 40, seed=args.seed, run_dir=run_dir, console=console)
    console.print(
        f"validation exact answer (greedy): {outcome.val_before:.2f} → {outcome.val_after:.2f} after "
        f"{len(outcome.algorithm.history)} steps in {outcome.wall_s:.0f} s; run directory {run_dir}"
    )


if __name__ == "__main__":
    main()
