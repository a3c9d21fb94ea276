"""Train the SQL agent of ``agent.py`` with Agent Lightning. This file is the only one that knows Agent Lightning.

The wiring is three things: ``agentlightning_langchain.instrument()`` (records every LangGraph agent, tool and model
call of a rollout), a ``@rollout`` function that runs the unmodified agent with the rollout's model and returns the
execution-match reward, and ``Trainer.fit`` with LightningRL told to train the ``writer`` and ``rewriter`` agents
only (the ``checker`` keeps running, untrained).

    python -m examples.sql.train                  # CPU: the tiny GPT learns the reduced task (~1-2 min)
    python -m examples.sql.train --dev            # one pass against a fake upstream; span trees printed
    python -m examples.sql.train --model Qwen/Qwen2.5-Coder-1.5B-Instruct --backend verl   # GPU
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

import agentlightning_langchain
from agentlightning import LLM, Trainer, rollout
from agentlightning.agent import FunctionAgent
from agentlightning.store.base import LightningStore
from agentlightning_trainer import LightningRL, LightningRLConfig, PolicySpec
from examples.sql import data
from examples.sql.agent import PROMPTS, QueryFormat, answer_question

TRAINED_AGENTS: Final = ["writer", "rewriter"]
# The reduced CPU task: questions answered by one of these sketches (a count of a table, an aggregate of a column).
CPU_SKETCHES: Final = (
    "count employees",
    "count projects",
    "count departments",
    "avg salary",
    "max salary",
    "sum budget",
)
# Words of the database's error messages, so that an error costs the tiny GPT a few tokens, not one per character.
_ERROR_WORDS: Final = "error near syntax incomplete input no such column table rows unrecognized token"


def make_agent(db_path: Path, *, query_format: QueryFormat, max_rewrites: int = 1) -> FunctionAgent:
    """The rollout function: run the unmodified agent with the rollout's model; reward = execution match."""

    @rollout(name="sql-agent")
    async def sql_agent(task: dict[str, Any], llm: LLM) -> float:
        state = await answer_question(
            task["question"],
            db_path,
            base_url=llm.base_url,
            model=llm.model,
            query_format=query_format,
            max_rewrites=max_rewrites,
            temperature=float(llm.sampling.get("temperature", 0.0)),
            max_tokens=int(llm.sampling.get("max_tokens", 256)),
        )
        return data.execution_match(db_path, state.get("sql"), task["gold_sql"])

    return sql_agent


def vocabulary(questions: list[data.Question]) -> tuple[str, ...]:
    """Whole-word tokens of the tiny GPT: the words of the sketch prompts, the questions and the database errors,
    plus one token per sketch of the CPU task (as the quickstart's tool names: a random policy can hit one)."""
    texts = [*PROMPTS["sketch"].values(), *(q.question for q in questions), "question query result review"]
    words: dict[str, None] = dict.fromkeys(CPU_SKETCHES)
    for word in re.findall(r"[a-z]+", " ".join([*texts, _ERROR_WORDS]).lower()):
        if len(word) > 1:
            words.setdefault(word)
    return tuple(words)


def cpu_tasks(db_path: Path) -> list[dict[str, Any]]:
    """The reduced CPU task: every generated question whose answer is one of ``CPU_SKETCHES``."""
    return [q.as_task() for q in data.questions(db_path) if q.sketch in CPU_SKETCHES]


def full_tasks(db_path: Path, *, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out validation tasks over every question (GPU mode)."""
    train, val = data.split(data.questions(db_path), seed=seed)
    return [q.as_task() for q in train], [q.as_task() for q in val]


def cpu_config(db_path: Path, *, steps: int = 40, seed: int = 0, run_dir: Path | None = None) -> LightningRLConfig:
    """The CPU settings: the tiny GPT with this example's words, batches sized for a 2-core machine."""
    return LightningRLConfig(
        # Only the CPU task's words: a smaller vocabulary is a likelier first hit for a random policy.
        policy=PolicySpec(words=vocabulary([q for q in data.questions(db_path) if q.sketch in CPU_SKETCHES])),
        agents=TRAINED_AGENTS,
        steps=steps,
        seed=seed,
        tasks_per_step=8,
        samples_per_task=16,
        # Rollouts (two or three LangGraph model calls each) cost far more than updates: squeeze each batch with
        # two passes in mini-batches of 32 transitions.
        epochs=2,
        mini_batch_size=32,
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
        agents=TRAINED_AGENTS,
        steps=steps,
        seed=seed,
        tasks_per_step=16,
        samples_per_task=8 if backend == "verl" else 16,
        lr=1e-6,
        max_prompt_tokens=1024,
        max_response_tokens=256,
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
    db_path: Path,
    query_format: QueryFormat,
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
    agentlightning_langchain.instrument()
    started = time.perf_counter()
    try:
        Trainer(algorithm, store=opened, n_runners=n_runners, console=console).fit(
            make_agent(db_path, query_format=query_format), train_tasks, val_tasks
        )
    finally:
        agentlightning_langchain.uninstrument()
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
    """Train the tiny GPT on the reduced task; validation (greedy) runs on the same questions."""
    import torch

    torch.set_num_threads(1)  # the policy server, the agents and the learner share two cores
    run_dir = run_dir or Path("runs") / time.strftime("sql-%Y%m%d-%H%M%S")
    db_path = data.build_database(run_dir / "company.db")
    tasks = cpu_tasks(db_path)
    config = cpu_config(db_path, steps=steps, seed=seed, run_dir=run_dir)
    return train(
        config, db_path=db_path, query_format="sketch", train_tasks=tasks, val_tasks=tasks, run_dir=run_dir,
        console=console, **options,
    )  # fmt: skip


def scripted_upstream(sketches: dict[str, str]) -> Any:
    """The fake upstream's scripted agents: the writer errs, the rewriter writes the gold sketch, the checker approves.

    With two rewrites allowed this walks every edge of the graph: the failing query goes straight to the rewriter,
    whose query the checker reviews and approves.
    """
    from agentlightning.testing.fake_openai import FakeReply, FakeRequest

    def reply(request: FakeRequest) -> FakeReply:
        system = str(request.messages[0].get("content", "")) if request.messages else ""
        if system == PROMPTS["sketch"]["writer"]:
            return FakeReply(text="tell me")  # not a sketch: the query fails to run
        if system == PROMPTS["sketch"]["checker"]:
            return FakeReply(text="correct")
        question = request.last_user_text.split("\n", 1)[0].removeprefix("question: ")
        return FakeReply(text=sketches.get(question, "count employees"))

    return reply


async def dev_async(n_tasks: int = 2, *, run_dir: Path, console: Console | None = None) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` questions once against the fake upstream through the LLM proxy; print each span tree."""
    from agentlightning.proxy import flush_proxy_spans
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.testing.fake_openai import FakeOpenAI
    from examples.rag.span_tree import print_span_trees, proxy_on_loop

    console = console or Console()
    db_path = data.build_database(run_dir / "company.db")
    every = cpu_tasks(db_path)
    tasks = every[:: max(1, len(every) // n_tasks)][:n_tasks]
    store = InMemoryLightningStore()
    agentlightning_langchain.instrument()
    try:
        with FakeOpenAI(reply=scripted_upstream({t["question"]: t["sketch"] for t in every})).serve() as upstream:
            async with proxy_on_loop(store, upstream.base_url) as (proxy_url, proxy_app):
                await store.add_resources({"llm": LLM(base_url=proxy_url, model="fake", proxied=True)})
                trainer = Trainer(store=store, n_runners=2, console=console)
                agent = make_agent(db_path, query_format="sketch", max_rewrites=2)
                rows = await trainer.dev_async(agent, tasks, timeout_s=60)
                await flush_proxy_spans(proxy_app)
                trees = await print_span_trees(store, [r.rollout_id for r in rows], console)
    finally:
        agentlightning_langchain.uninstrument()
    return rows, trees


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; GPU options are validated here, before anything is built."""
    parser = argparse.ArgumentParser(description="Train the LangGraph SQL agent (writer, checker, rewriter).")
    parser.add_argument("--dev", action="store_true", help="one pass against a fake upstream; print span trees")
    parser.add_argument("--model", help="GPU mode: a Hugging Face model id or local path to train")
    parser.add_argument("--backend", choices=("torch", "verl"), default="torch", help="GPU mode backend")
    parser.add_argument("--steps", type=int, default=None, help="training steps (CPU default 40, GPU 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: runs/sql-<timestamp>")
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
    run_dir: Path = args.run_dir or Path("runs") / time.strftime("sql-%Y%m%d-%H%M%S")
    if args.dev:
        asyncio.run(dev_async(run_dir=run_dir, console=console))
        return
    if args.model:
        db_path = data.build_database(run_dir / "company.db")
        train_tasks, val_tasks = full_tasks(db_path, seed=args.seed)
        try:
            config = gpu_config(
                args.model, backend=args.backend, steps=args.steps or 200, seed=args.seed, run_dir=run_dir
            )
        except ValueError as exc:  # e.g. backend verl without verl installed: say so before any work
            raise SystemExit(f"error: {exc}") from exc
        outcome = train(
            config, db_path=db_path, query_format="sql", train_tasks=train_tasks, val_tasks=val_tasks,
            run_dir=run_dir, store=str(run_dir / "store.db"), console=console,
        )  # fmt: skip
    else:
        outcome = train_cpu(steps=args.steps or 40, seed=args.seed, run_dir=run_dir, console=console)
    console.print(
        f"validation execution match (greedy): {outcome.val_before:.2f} → {outcome.val_after:.2f} after "
        f"{len(outcome.algorithm.history)} steps in {outcome.wall_s:.0f} s; run directory {run_dir}"
    )


if __name__ == "__main__":
    main()
