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

from pathlib import Path
from typing import Any, Final

from rich.console import Console

import agentlightning_langchain
from agentlightning import LLM, rollout
from agentlightning.agent import FunctionAgent
from agentlightning_trainer import LightningRLConfig
from examples import _training
from examples._cli import ExampleCommand
from examples._dev import run_dev
from examples._training import TrainOutcome
from examples.sql import data
from examples.sql.agent import AGENT_NAMES, PROMPTS, QueryFormat, answer_question

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
# CPU task: the tiny GPT replies with at most 2 tokens drawn only from these (constrained decoding, the policy's
# ``reply_words``): the sketches, the checker's two verdicts, and its end token.
CPU_REPLY_WORDS: Final = (*CPU_SKETCHES, "correct", "wrong", "<|end|>")
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
            # Each trained agent calls its own weights (LightningRLConfig(adapter_per_agent=True)); the checker
            # calls the untouched base, so training cannot change how it reviews.
            agent_models={agent: llm.model_for(agent) for agent in AGENT_NAMES},
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
    return _training.tiny_gpt_words([t.lower() for t in [*texts, _ERROR_WORDS]], whole=CPU_SKETCHES, pattern=r"[a-z]+")


def cpu_tasks(db_path: Path) -> list[dict[str, Any]]:
    """The reduced CPU task: every generated question whose answer is one of ``CPU_SKETCHES``."""
    return [q.as_task() for q in data.questions(db_path) if q.sketch in CPU_SKETCHES]


def full_tasks(db_path: Path, *, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out validation tasks over every question (GPU mode)."""
    train, val = data.split(data.questions(db_path), seed=seed)
    return [q.as_task() for q in train], [q.as_task() for q in val]


def cpu_config(db_path: Path, *, steps: int = 60, seed: int = 0, run_dir: Path | None = None) -> LightningRLConfig:
    """The CPU settings: the tiny GPT with the CPU task's words (a smaller vocabulary is a likelier first hit for a
    random policy), only the writer and rewriter trained."""
    words = vocabulary([q for q in data.questions(db_path) if q.sketch in CPU_SKETCHES])
    return _training.cpu_config(
        words, steps=steps, seed=seed, run_dir=run_dir, agents=TRAINED_AGENTS, adapter_per_agent=True,
        reply_words=CPU_REPLY_WORDS, max_response_tokens=2,
    )  # fmt: skip


def gpu_config(model: str, *, backend: str, steps: int, seed: int = 0, run_dir: Path) -> LightningRLConfig:
    """Settings for a Hugging Face model on a GPU (validated here; running them needs the GPU)."""
    return _training.gpu_config(
        model, backend=backend, steps=steps, seed=seed, run_dir=run_dir, agents=TRAINED_AGENTS,
        adapter_per_agent=backend == "torch", max_prompt_tokens=1024, max_response_tokens=256,
    )  # fmt: skip


def train_cpu(
    steps: int = 60, seed: int = 0, run_dir: Path | None = None, console: Console | None = None, **options: Any
) -> TrainOutcome:
    """Train the tiny GPT on the reduced task; validation (greedy) runs on the same questions."""
    run_dir = run_dir or _training.default_run_dir("sql")
    db_path = data.build_database(run_dir / "company.db")
    tasks = cpu_tasks(db_path)
    config = cpu_config(db_path, steps=steps, seed=seed, run_dir=run_dir)
    agent = make_agent(db_path, query_format="sketch")
    return _training.fit(
        config, agent, tasks, tasks, instrumentation=agentlightning_langchain, run_dir=run_dir, console=console,
        **options,
    )  # fmt: skip


def train_gpu(model: str, *, backend: str, steps: int, seed: int, run_dir: Path, console: Console) -> TrainOutcome:
    """Train a Hugging Face model on all questions (SQL format, held-out validation) on a GPU."""
    db_path = data.build_database(run_dir / "company.db")
    train_tasks, val_tasks = full_tasks(db_path, seed=seed)
    config = gpu_config(model, backend=backend, steps=steps, seed=seed, run_dir=run_dir)
    agent = make_agent(db_path, query_format="sql")
    return _training.fit(
        config, agent, train_tasks, val_tasks, instrumentation=agentlightning_langchain, run_dir=run_dir,
        store=str(run_dir / "store.db"), console=console,
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
    db_path = data.build_database(run_dir / "company.db")
    every = cpu_tasks(db_path)
    reply = scripted_upstream({t["question"]: t["sketch"] for t in every})
    agent = make_agent(db_path, query_format="sketch", max_rewrites=2)
    return await run_dev(
        agent, every, reply, n_tasks=n_tasks, instrumentation=agentlightning_langchain, console=console
    )


# The command line (``examples/_cli.py``): CPU training by default, ``--model`` for a GPU, ``--dev``.
COMMAND = ExampleCommand(
    "sql",
    "Train the LangGraph SQL agent (writer, checker, rewriter).",
    "execution match",
    60,
    train_cpu,
    train_gpu,
    dev_async,
)

if __name__ == "__main__":
    COMMAND.main()
