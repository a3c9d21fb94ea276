"""Train the multi-hop research agent (``agent.py``) with LightningRL; only the Agent Lightning wiring lives here.

The wiring: ``agentlightning_openai_agents.instrument()`` records the Agents SDK's spans; the ``@rollout`` function
runs the unmodified agent with the model's base URL set to the LLM proxy and returns the answer's F1 (primary) and
exact match; each search that retrieves the next supporting passage of the question's gold chain is rewarded on
the spot (``emit_reward``), which the per-call credit gives to the reply that asked for it; ``Trainer.fit`` runs
it all.

    python -m examples.rag.train                  # CPU: tiny GPT policy, ~1-2 min
    python -m examples.rag.train --dev            # one pass against the fake upstream, span trees printed
    python -m examples.rag.train --model /models/Qwen2.5-1.5B-Instruct --backend verl   # GPU
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

import agentlightning_openai_agents
from agentlightning import LLM, emit_reward, rollout
from examples import _training
from examples._cli import ExampleCommand
from examples._dev import run_dev
from examples._training import TrainOutcome
from examples.rag import corpus
from examples.rag.agent import INSTRUCTIONS, Retriever, Step, answer_question, prompt

WORLD = corpus.build_world(seed=0)
RETRIEVER = Retriever(WORLD.passages)
# The CPU task: 2-hop questions, two searches then the entity reached is the answer (see the README).
CPU_MAX_TURNS = 2
CPU_CHAINS = (("director", "birthplace"), ("studio", "headquarters"))
GPU_MAX_TURNS = 4


@rollout
async def rag_agent(task: dict[str, Any], llm: LLM) -> dict[str, float]:
    """Answer one question; reward each supporting passage found, return answer F1 (primary) and exact match."""
    path: list[str] = task["path"]

    def reward_hop(step: Step) -> None:
        # A hop counts when it stands on the gold path and retrieves the passage naming the next bridge entity.
        hop = path.index(step.entity) if step.entity in path[:-1] else -1
        found = step.passage is not None and hop >= 0 and step.passage.answer == path[hop + 1]
        emit_reward({"supporting": 1.0 if found else 0.0})

    answer = await answer_question(
        task["question"],
        RETRIEVER,
        base_url=llm.base_url,
        model=llm.model,
        temperature=float(llm.sampling.get("temperature", 0.7)),
        max_tokens=int(llm.sampling.get("max_tokens", 32)),
        max_turns=int(task.get("max_turns", GPU_MAX_TURNS)),
        on_step=reward_hop,
    )
    return {"f1": corpus.answer_f1(answer, task["answer"]), "exact_match": corpus.exact_match(answer, task["answer"])}


def vocabulary() -> tuple[str, ...]:
    """Whole-word tokens for the tiny GPT: every word of the instructions, questions, prompts and passages."""
    texts = [INSTRUCTIONS, prompt("", "unknown", []), "search answer", *corpus.TEMPLATES]
    texts += [p.text for p in WORLD.passages]
    return _training.tiny_gpt_words(texts, spaced=True)


def cpu_tasks(max_turns: int = CPU_MAX_TURNS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out validation questions with the CPU turn budget."""
    train, val = corpus.split(seed=0)

    def reduced(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [t | {"max_turns": max_turns} for t in tasks if tuple(t["chain"]) in CPU_CHAINS]

    return reduced(train), reduced(val)


def cpu_config(steps: int, seed: int, run_dir: Path | None = None, transitions: str = "call") -> Any:
    """The LightningRL settings that learn this task on a CPU (``transitions="trajectory"``: one sequence a rollout)."""
    return _training.cpu_config(
        vocabulary(), steps=steps, seed=seed, run_dir=run_dir, max_seq_len=160,
        # Measured on this task (in-process runs of the same decisions): lr 1e-3 with one update per step reached
        # a per-search accuracy of 0.2 in 30 steps; 2e-3 with 32-transition mini-batches (8 updates a step)
        # reached 0.6.
        lr=2e-3, credit="per_call", max_prompt_tokens=150, max_response_tokens=4, val_every=5,
        transitions=transitions,
    )  # fmt: skip


def train_cpu(
    steps: int = 30,
    seed: int = 0,
    run_dir: Path | None = None,
    console: Console | None = None,
    transitions: str = "call",
    **options: Any,
) -> TrainOutcome:
    """Train the tiny GPT on the CPU task; returns the outcome (``algorithm.val_history``, ``algorithm.history``)."""
    run_dir = run_dir or _training.default_run_dir("rag")
    train, val = cpu_tasks()
    return _training.fit(
        cpu_config(steps, seed, run_dir, transitions), rag_agent, train, val,
        instrumentation=agentlightning_openai_agents, run_dir=run_dir, n_runners=96, console=console, **options,
    )  # fmt: skip


def train_gpu(model: str, *, backend: str, steps: int, seed: int, run_dir: Path, console: Console) -> TrainOutcome:
    """Train a Hugging Face model (``model``: id or local path) on a GPU with the torch or verl backend."""
    config = _training.gpu_config(
        model, backend=backend, steps=steps, seed=seed, run_dir=run_dir, tasks_per_step=12, credit="per_call",
        max_prompt_tokens=1024, max_response_tokens=48,
    )  # fmt: skip
    train, val = corpus.split(seed=0)
    return _training.fit(
        config, rag_agent, train, val, instrumentation=agentlightning_openai_agents, run_dir=run_dir,
        store=str(run_dir / "store.db"), console=console,
    )  # fmt: skip


def fake_reply(request: Any) -> Any:
    """The fake upstream's scripted researcher: follow the question's chain one hop per reply, then answer."""
    from agentlightning.testing.fake_openai import FakeReply

    text = request.last_user_text
    question = text.split("\n", 1)[0].removeprefix("question : ")
    chain = next((c for t, c in corpus.TEMPLATES.items() if t.split("{e}")[0] in question), ())
    hops = text.count(" is ")
    return FakeReply(text=f"search {chain[hops]}" if hops < len(chain) else "answer")


async def dev_async(
    n_tasks: int = 2, *, run_dir: Path | None = None, console: Console | None = None
) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` questions once against the fake upstream through the LLM proxy; print each span tree."""
    del run_dir  # nothing to keep: the corpus is generated in memory
    return await run_dev(  # spread over the templates: 2- and 3-hop chains
        rag_agent, corpus.questions(WORLD), fake_reply, n_tasks=n_tasks, instrumentation=agentlightning_openai_agents,
        console=console,
    )  # fmt: skip


# The command line (``examples/_cli.py``): CPU training by default, ``--model`` for a GPU, ``--dev``.
COMMAND = ExampleCommand(
    "rag",
    "Train the multi-hop RAG agent (OpenAI Agents SDK) with LightningRL.",
    "answer F1",
    30,
    train_cpu,
    train_gpu,
    dev_async,
)

if __name__ == "__main__":
    COMMAND.main()
