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

import argparse
import asyncio
import re
import time
from pathlib import Path
from typing import Any

from rich.console import Console

import agentlightning_openai_agents
from agentlightning import LLM, Trainer, emit_reward, rollout
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
    words: dict[str, None] = {}
    for text in texts:
        for word in re.findall(r"[A-Za-z]+", text):
            if len(word) > 1:
                words.setdefault(" " + word)
                words.setdefault(word)
    return tuple(words)


def cpu_tasks(max_turns: int = CPU_MAX_TURNS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out validation questions with the CPU turn budget."""
    train, val = corpus.split(seed=0)

    def reduced(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [t | {"max_turns": max_turns} for t in tasks if tuple(t["chain"]) in CPU_CHAINS]

    return reduced(train), reduced(val)


def cpu_config(steps: int, seed: int, run_dir: Path | None = None) -> Any:
    """The LightningRL settings that learn this task on a CPU (shared/TRAINER.md: K=16, lr 1e-3, 12 tasks/step)."""
    from agentlightning_trainer import LightningRLConfig, PolicySpec

    return LightningRLConfig(
        policy=PolicySpec(words=vocabulary(), max_seq_len=160),
        steps=steps,
        seed=seed,
        tasks_per_step=8,
        samples_per_task=16,
        # Measured on this task (in-process runs of the same decisions): lr 1e-3 with one update per step reached
        # a per-search accuracy of 0.2 in 30 steps; 2e-3 with 32-transition mini-batches (8 updates a step)
        # reached 0.6. Rollouts (two Agents SDK runs each) cost far more than updates, so squeeze each batch.
        lr=2e-3,
        mini_batch_size=32,
        epochs=2,
        credit="per_call",
        max_prompt_tokens=150,
        max_response_tokens=4,
        val_every=5,
        checkpoint_dir=None if run_dir is None else run_dir / "checkpoints",
        log_dir=None if run_dir is None else run_dir / "tensorboard",
    )


def train_cpu(
    steps: int = 30, seed: int = 0, runners: int = 96, run_dir: Path | None = None, console: Console | None = None
) -> Any:
    """Train the tiny GPT on the CPU task; returns the LightningRL algorithm (``val_history``, ``history``)."""
    import torch

    from agentlightning_trainer import LightningRL

    torch.set_num_threads(1)  # the policy server, the SDK runs and the learner share two cores
    agentlightning_openai_agents.instrument()
    run_dir = run_dir or Path("runs") / time.strftime("rag-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    algorithm = LightningRL(cpu_config(steps, seed, run_dir), run_dir=run_dir, console=console)
    train, val = cpu_tasks()
    Trainer(algorithm, store=":memory:", n_runners=runners, console=console).fit(rag_agent, train, val)
    return algorithm


def train_gpu(model: str, backend: str, steps: int, run_dir: Path | None, console: Console) -> Any:
    """Train a Hugging Face model (``model``: id or local path) on a GPU with the torch or verl backend."""
    from agentlightning_trainer import LightningRL, LightningRLConfig, PolicySpec

    agentlightning_openai_agents.instrument()
    run_dir = run_dir or Path("runs") / time.strftime("rag-gpu-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = LightningRLConfig(
        backend=backend,  # type: ignore[arg-type]  # validated by parse_args
        policy=PolicySpec(kind="hf", model_name=Path(model).name or model, hf_model=model),
        steps=steps, samples_per_task=8 if backend == "verl" else 16, lr=1e-6, credit="per_call",
        max_prompt_tokens=1024, max_response_tokens=48, checkpoint_dir=run_dir / "checkpoints",
    )  # fmt: skip
    if backend == "verl":
        from agentlightning_trainer.verl import VerlLightningRL

        algorithm: Any = VerlLightningRL(config, run_dir=run_dir, console=console)
    else:
        algorithm = LightningRL(config, run_dir=run_dir, console=console)
    train, val = corpus.split(seed=0)
    Trainer(algorithm, store=run_dir / "store.db", n_runners=64, console=console).fit(rag_agent, train, val)
    return algorithm


def fake_reply(request: Any) -> Any:
    """The fake upstream's scripted researcher: follow the question's chain one hop per reply, then answer."""
    from agentlightning.testing.fake_openai import FakeReply

    text = request.last_user_text
    question = text.split("\n", 1)[0].removeprefix("question : ")
    chain = next((c for t, c in corpus.TEMPLATES.items() if t.split("{e}")[0] in question), ())
    hops = text.count(" is ")
    return FakeReply(text=f"search {chain[hops]}" if hops < len(chain) else "answer")


async def dev_async(n_tasks: int = 2, console: Console | None = None) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` questions once against the fake upstream through the LLM proxy; print each span tree."""
    from agentlightning.proxy import flush_proxy_spans
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.testing.fake_openai import FakeOpenAI
    from examples.rag.span_tree import print_span_trees, proxy_on_loop

    console = console or Console()
    agentlightning_openai_agents.instrument()
    store = InMemoryLightningStore()
    every = corpus.questions(WORLD)
    tasks = every[:: max(1, len(every) // n_tasks)][:n_tasks]  # spread over the templates: 2- and 3-hop chains
    with FakeOpenAI(reply=fake_reply).serve() as upstream:
        async with proxy_on_loop(store, upstream.base_url) as (proxy_url, proxy_app):
            await store.add_resources({"llm": LLM(base_url=proxy_url, model="fake", proxied=True)})
            trainer = Trainer(store=store, n_runners=2, console=console)
            rows = await trainer.dev_async(rag_agent, tasks, timeout_s=60)
            await flush_proxy_spans(proxy_app)
            trees = await print_span_trees(store, [r.rollout_id for r in rows], console)
    return rows, trees


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; GPU options are validated here, before anything is built."""
    parser = argparse.ArgumentParser(description="Train the multi-hop RAG agent (OpenAI Agents SDK) with LightningRL.")
    parser.add_argument("--dev", action="store_true", help="one pass against the fake upstream; print span trees")
    parser.add_argument("--model", help="GPU mode: a Hugging Face model id or local path to train")
    parser.add_argument("--backend", choices=("torch", "verl"), default="torch", help="GPU mode backend")
    parser.add_argument("--steps", type=int, default=None, help="training steps (CPU default 30, GPU 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: runs/rag-<timestamp>")
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
    if args.dev:
        asyncio.run(dev_async(console=console))
        return
    started = time.perf_counter()
    if args.model:
        algorithm = train_gpu(args.model, args.backend, args.steps or 200, args.run_dir, console)
    else:
        algorithm = train_cpu(steps=args.steps or 30, seed=args.seed, run_dir=args.run_dir, console=console)
    val = algorithm.val_history
    if val:
        console.print(
            f"validation answer F1 (greedy): {val[0][1]:.2f} → {val[-1][1]:.2f} after {len(algorithm.history)} steps "
            f"in {time.perf_counter() - started:.0f} s"
        )


if __name__ == "__main__":
    main()
