"""Train the support desk's specialist (``agent.py``) with LightningRL; only the Agent Lightning wiring lives here.

The wiring: ``agentlightning_crewai.instrument()`` records the crew's spans (agents by role); the ``@rollout``
function runs the unmodified crew with every agent's model pointed at the LLM proxy, flushes the listener, and
returns 1 when the specialist routed the ticket to the right team; ``LightningRLConfig(agents=["specialist"])``
trains the specialist's calls only — the planner and critic call the same model but their calls become no
training data; ``Trainer.fit`` runs it all.

    python -m examples.crew.train                 # CPU: tiny GPT policy (see the README for what it learns)
    python -m examples.crew.train --dev           # one pass against the fake upstream, span trees printed
    python -m examples.crew.train --model /models/Qwen2.5-1.5B-Instruct --backend verl   # GPU
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from pathlib import Path
from typing import Any, Final

from rich.console import Console

import agentlightning_crewai
from agentlightning import LLM, Trainer, rollout
from examples.crew.agent import TEAMS, OpenAITextLLM, TeamDirectoryTool, handle_ticket

TRAINED_AGENTS: Final = ["specialist"]

# (ticket, the team that handles it): three kinds of ticket per team.
TICKETS: Final = (
    ("my card was charged twice", "billing"),
    ("I need an invoice for my order", "billing"),
    ("where is my refund of the payment", "billing"),
    ("the parcel has not arrived", "shipping"),
    ("the tracking number does not work", "shipping"),
    ("the delivery came to the wrong address", "shipping"),
    ("the app crashes on start", "technical"),
    ("I forgot my password", "technical"),
    ("the login page shows an error", "technical"),
    ("I want to send the shoes back", "returns"),
    ("can I exchange the shirt for a larger one", "returns"),
    ("the jacket does not fit and goes back", "returns"),
)


def tasks() -> list[dict[str, str]]:
    """The tickets as rollout inputs."""
    return [{"request": request, "team": team} for request, team in TICKETS]


@rollout
def crew_agent(task: dict[str, Any], llm: LLM) -> float:
    """Run the crew on one ticket (every agent on the proxied model); 1.0 when the specialist picked the team."""
    temperature = float(llm.sampling.get("temperature", 0.7))
    max_tokens = int(llm.sampling.get("max_tokens", 256))
    models = [
        OpenAITextLLM(model=llm.model, base_url=llm.base_url, temperature=temperature, max_tokens=max_tokens)
        for _ in ("planner", "specialist", "critic")
    ]
    try:
        team = handle_ticket(task["request"], *models)
    finally:
        for model in models:
            model.close()
        agentlightning_crewai.flush()  # CrewAI handles events on its own threads: let the last spans land
    return 1.0 if team == task["team"] else 0.0


# The parts of CrewAI's prompts a sequential crew of text-model agents sends (its translation file has many more).
_CREWAI_SLICES: Final = (
    "role_playing", "tools", "no_tools", "task", "task_no_tools", "task_with_context", "expected_output", "format",
    "final_answer_format", "format_without_tools", "observation",
)  # fmt: skip


def _crewai_prompt_pieces() -> list[str]:
    """The fixed text of CrewAI's prompts (its English translation file), split at the template's placeholders."""
    import importlib.resources
    import json

    slices = json.loads(importlib.resources.files("crewai").joinpath("translations/en.json").read_text())["slices"]
    pieces: list[str] = []
    for name in _CREWAI_SLICES:
        text = slices.get(name, "")
        for line in str(text).split("\n"):
            pieces += [p for p in re.split(r"\{[a-z_]+\}", line) if len(p.strip()) > 3]
    return pieces


def vocabulary() -> tuple[str, ...]:
    """Tokens for the tiny GPT: CrewAI's fixed prompt lines whole (as a BPE merges frequent strings), then words."""
    tool = TeamDirectoryTool()
    crew_texts = [
        "You are planner specialist critic . Your personal goal is : Plan how the desk answers a ticket A calm "
        "dispatcher Route each ticket to the right team Knows every Check the routing Hard to please a plan "
        "one team a verdict of Current Task This is the expected criteria for your final answer Tool Name "
        "Arguments Description properties title type object additionalProperties false required Schema",
        tool.name, tool.description, tool._run(), *TEAMS, *TEAMS.values(),
    ]  # fmt: skip
    crew_texts += [request for request, _ in TICKETS]
    tokens: dict[str, None] = dict.fromkeys(TEAMS)
    for piece in _crewai_prompt_pieces():
        tokens.setdefault(piece)
    # Words only from the crew's own texts: every extra token is one more wrong reply a random policy can sample.
    for text in crew_texts:
        for word in re.findall(r"[A-Za-z_]+", text):
            if len(word) > 1:
                tokens.setdefault(" " + word)
                tokens.setdefault(word)
    return tuple(tokens)


def cpu_config(steps: int, seed: int, run_dir: Path | None = None) -> Any:
    """LightningRL settings for the tiny GPT on the CPU; only the specialist's calls are trained."""
    from agentlightning_trainer import LightningRLConfig, PolicySpec

    return LightningRLConfig(
        policy=PolicySpec(words=vocabulary(), max_seq_len=400),
        agents=TRAINED_AGENTS,
        steps=steps,
        seed=seed,
        tasks_per_step=8,
        samples_per_task=16,
        lr=2e-3,  # with 32-transition mini-batches: the setting that learned the RAG example's CPU task fastest
        mini_batch_size=32,
        epochs=2,
        max_prompt_tokens=380,
        max_response_tokens=4,  # the planner's and critic's replies are context too: keep them short
        val_every=5,
        checkpoint_dir=None if run_dir is None else run_dir / "checkpoints",
        log_dir=None if run_dir is None else run_dir / "tensorboard",
    )


def train_cpu(
    steps: int = 60,
    seed: int = 0,
    runners: int = 32,
    run_dir: Path | None = None,
    console: Console | None = None,
    store: str = ":memory:",
) -> Any:
    """Train the tiny GPT's specialist on the tickets (``store``: a SQLite path keeps spans); returns LightningRL."""
    import torch

    from agentlightning_trainer import LightningRL

    torch.set_num_threads(1)  # the policy server, the crews and the learner share the CPU
    agentlightning_crewai.instrument()
    run_dir = run_dir or Path("runs") / time.strftime("crew-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    algorithm = LightningRL(cpu_config(steps, seed, run_dir), run_dir=run_dir, console=console)
    Trainer(algorithm, store=store, n_runners=runners, console=console).fit(crew_agent, tasks(), tasks())
    return algorithm


def train_gpu(model: str, backend: str, steps: int, run_dir: Path | None, console: Console) -> Any:
    """Train a Hugging Face model's specialist calls (``model``: id or local path) on a GPU, torch or verl backend."""
    from agentlightning_trainer import LightningRL, LightningRLConfig, PolicySpec

    agentlightning_crewai.instrument()
    run_dir = run_dir or Path("runs") / time.strftime("crew-gpu-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = LightningRLConfig(
        backend=backend,  # type: ignore[arg-type]  # validated by parse_args
        policy=PolicySpec(kind="hf", model_name=Path(model).name or model, hf_model=model),
        agents=TRAINED_AGENTS, steps=steps, samples_per_task=8 if backend == "verl" else 16, lr=1e-6,
        max_prompt_tokens=2048, max_response_tokens=256, checkpoint_dir=run_dir / "checkpoints",
    )  # fmt: skip
    if backend == "verl":
        from agentlightning_trainer.verl import VerlLightningRL

        algorithm: Any = VerlLightningRL(config, run_dir=run_dir, console=console)
    else:
        algorithm = LightningRL(config, run_dir=run_dir, console=console)
    Trainer(algorithm, store=run_dir / "store.db", n_runners=32, console=console).fit(crew_agent, tasks(), tasks())
    return algorithm


def fake_reply(request: Any) -> Any:
    """The fake upstream's scripted crew: the specialist consults its directory, then routes; the others answer."""
    from agentlightning.testing.fake_openai import FakeReply

    system = next((str(m.get("content", "")) for m in request.messages if m.get("role") == "system"), "")
    seen_directory = any("Observation" in str(m.get("content", "")) for m in request.messages[1:])
    if system.startswith("You are specialist") and not seen_directory:
        return FakeReply(text="Thought: I check the teams.\nAction: team_directory\nAction Input: {}")
    if system.startswith("You are specialist"):
        team = next(t for r, t in TICKETS if r in request.last_user_text or r in str(request.messages))
        return FakeReply(text=f"Thought: I now know the final answer\nFinal Answer: {team}")
    if system.startswith("You are planner"):
        return FakeReply(text="Thought: done\nFinal Answer: read the ticket and pick the team")
    return FakeReply(text="Thought: done\nFinal Answer: the routing is right")


async def dev_async(n_tasks: int = 2, console: Console | None = None) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` tickets once against the fake upstream through the LLM proxy; print each span tree."""
    from agentlightning.proxy import flush_proxy_spans
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.testing.fake_openai import FakeOpenAI
    from examples.rag.span_tree import print_span_trees, proxy_on_loop

    console = console or Console()
    agentlightning_crewai.instrument()
    store = InMemoryLightningStore()
    chosen = tasks()[:: max(1, len(TICKETS) // n_tasks)][:n_tasks]
    with FakeOpenAI(reply=fake_reply).serve() as upstream:
        async with proxy_on_loop(store, upstream.base_url) as (proxy_url, proxy_app):
            await store.add_resources({"llm": LLM(base_url=proxy_url, model="fake", proxied=True)})
            trainer = Trainer(store=store, n_runners=2, console=console)
            rows = await trainer.dev_async(crew_agent, chosen, timeout_s=120)
            await flush_proxy_spans(proxy_app)
            trees = await print_span_trees(store, [r.rollout_id for r in rows], console)
    return rows, trees


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; GPU options are validated here, before anything is built."""
    parser = argparse.ArgumentParser(description="Train the support desk's specialist (CrewAI) with LightningRL.")
    parser.add_argument("--dev", action="store_true", help="one pass against the fake upstream; print span trees")
    parser.add_argument("--model", help="GPU mode: a Hugging Face model id or local path to train")
    parser.add_argument("--backend", choices=("torch", "verl"), default="torch", help="GPU mode backend")
    parser.add_argument("--steps", type=int, default=None, help="training steps (CPU default 60, GPU 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: runs/crew-<timestamp>")
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
        algorithm = train_cpu(steps=args.steps or 60, seed=args.seed, run_dir=args.run_dir, console=console)
    val = algorithm.val_history
    if val:
        console.print(
            f"validation routing accuracy (greedy): {val[0][1]:.2f} → {val[-1][1]:.2f} after "
            f"{len(algorithm.history)} steps in {time.perf_counter() - started:.0f} s"
        )


if __name__ == "__main__":
    main()
