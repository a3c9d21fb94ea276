"""Train the support desk's specialist (``agent.py``) with LightningRL; only the Agent Lightning wiring lives here.

The wiring: ``agentlightning_crewai.instrument()`` records the crew's spans (agents by role); the ``@rollout``
function runs the unmodified crew with every agent's model pointed at the LLM proxy, flushes the listener, and
returns 1 when the specialist routed the ticket to the right team; ``LightningRLConfig(agents=["specialist"],
adapter_per_agent=True)`` gives the specialist weights of its own and trains its calls only — the planner and critic
are served by the untouched base model, and their calls become no training data; ``Trainer.fit`` runs it all. The
crew uses CrewAI's own ``LLM`` class with native tool calls, on the CPU's tiny policy as on a real model.

    python -m examples.crew.train                 # CPU: tiny GPT policy (see the README for what it learns)
    python -m examples.crew.train --dev           # one pass against the fake upstream, span trees printed
    python -m examples.crew.train --model /models/Qwen2.5-1.5B-Instruct --backend verl   # GPU
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Final

from rich.console import Console

import agentlightning_crewai
from agentlightning import LLM, rollout
from agentlightning_trainer.tool_calls import format_tool_call
from examples import _training
from examples._cli import ExampleCommand
from examples._dev import run_dev
from examples._training import TrainOutcome
from examples.crew.agent import TEAMS, TeamDirectoryTool, close_model, handle_ticket, openai_model

TRAINED_AGENTS: Final = ["specialist"]


class _WithoutTokenEstimateWarning(logging.Filter):
    """CrewAI estimates the prompt's token count before every call to an OpenAI-compatible server that has no count
    route, and warns each time it does; the estimate is all the crew needs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Using an approximate input token count")


logging.getLogger("crewai.llms.base_llm").addFilter(_WithoutTokenEstimateWarning())
# CPU task: the tiny GPT replies with one token (constrained decoding, the policy's ``reply_words``): a team, with or
# without a leading space, or a native call of the specialist's tool (one token of the compact call format, which the
# policy server returns as an OpenAI tool call and CrewAI runs; the specialist then answers again). The desk routes
# the ticket to the team the specialist's final reply names. A one-token reply is never empty, which CrewAI would
# reject, so no end token is needed.
DIRECTORY_CALL: Final = format_tool_call("team_directory", {}, compact=True)
CPU_REPLY_WORDS: Final = (
    "billing", "shipping", "technical", "returns", " billing", " shipping", " technical", " returns", DIRECTORY_CALL,
)  # fmt: skip
CPU_REPLY_TOKENS: Final = 1

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


def tasks(helper_max_tokens: int | None = None) -> list[dict[str, Any]]:
    """The tickets as rollout inputs; ``helper_max_tokens`` caps the planner's and critic's replies (the CPU task)."""
    return [{"request": request, "team": team, "helper_max_tokens": helper_max_tokens} for request, team in TICKETS]


@rollout
def crew_agent(task: dict[str, Any], llm: LLM) -> float:
    """Run the crew on one ticket (through the proxy); 1.0 when the specialist picked the team.

    Each agent calls ``llm.model_for(name)``: with ``adapter_per_agent=True`` the specialist calls its own weights
    and the planner and critic the untouched base, so training cannot change how they behave.
    """
    temperature = float(llm.sampling.get("temperature", 0.7))
    max_tokens = int(llm.sampling.get("max_tokens", 256))
    helper_max_tokens = task.get("helper_max_tokens") or max_tokens
    limits = {"planner": helper_max_tokens, "specialist": max_tokens, "critic": helper_max_tokens}
    models = [
        openai_model(llm.model_for(name), llm.base_url, temperature=temperature, max_tokens=limit)
        for name, limit in limits.items()
    ]
    try:
        team = handle_ticket(task["request"], *models)
    finally:
        for model in models:
            close_model(model)
        agentlightning_crewai.flush()  # CrewAI handles events on its own threads: let the last spans land
    return 1.0 if team == task["team"] else 0.0


# The parts of CrewAI's prompts a sequential crew sends to models with native tool calls (its translation file has
# many more), and the error message it sends when an agent runs out of iterations.
_CREWAI_SLICES: Final = ("role_playing", "native_task", "task_no_tools", "task_with_context", "expected_output")


def _crewai_prompt_pieces() -> list[str]:
    """The fixed text of CrewAI's prompts (its English translation file), split at the template's placeholders."""
    import importlib.resources
    import json

    translations = json.loads(importlib.resources.files("crewai").joinpath("translations/en.json").read_text())
    texts = [str(translations["slices"].get(name, "")) for name in _CREWAI_SLICES]
    texts.append(str(translations["errors"].get("force_final_answer", "")))
    pieces: list[str] = []
    for text in texts:
        for line in text.split("\n"):
            pieces += [p for p in re.split(r"\{[a-z_]+\}", line) if len(p.strip()) > 3]
    return pieces


def vocabulary() -> tuple[str, ...]:
    """Tokens for the tiny GPT: CrewAI's fixed prompt lines whole (as a BPE merges frequent strings), then words."""
    tool = TeamDirectoryTool()
    crew_texts = [
        "You are planner specialist critic . Your personal goal is : Plan how the desk answers a ticket A calm "
        "dispatcher Route each ticket to the right team Knows every Check the routing Hard to please a plan "
        "one team a verdict of tools",
        tool.name, tool.description, tool._run(), *TEAMS, *TEAMS.values(),
    ]  # fmt: skip
    crew_texts += [request for request, _ in TICKETS]
    # Each team is a token, with and without its leading space, and so is the tool call; every other word only
    # without (a prompt spends one token more per word): each token is one more wrong reply a random policy can
    # sample.
    whole = dict.fromkeys([*TEAMS, *(f" {team}" for team in TEAMS), DIRECTORY_CALL, *_crewai_prompt_pieces()])
    return _training.tiny_gpt_words(crew_texts, whole=whole, pattern=r"[A-Za-z_]+")


def cpu_config(steps: int, seed: int, run_dir: Path | None = None) -> Any:
    """LightningRL settings for the tiny GPT on the CPU; only the specialist's calls are trained."""
    return _training.cpu_config(
        vocabulary(), steps=steps, seed=seed, run_dir=run_dir, max_seq_len=256, agents=TRAINED_AGENTS,
        adapter_per_agent=True, reply_words=CPU_REPLY_WORDS, max_prompt_tokens=240,
        max_response_tokens=CPU_REPLY_TOKENS,
        # Every ticket in every step (12 x 12 crews): each of the 12 routes gets a signal each step. A kickoff costs
        # far more than an update, so each batch is used 3 times in mini-batches of 32. PPO's high-side clip is
        # DAPO's 0.28: at 2.0 a sampled team's probability could triple in one step, and the boost spilled over to
        # the tickets of other teams, whose groups were all right and so had nothing to defend them: a whole team's
        # tickets turned wrong at once late in 3 of 4 runs at 2.0, in none of 3 at 0.28 (README).
        tasks_per_step=12, samples_per_task=12, lr=2e-3, epochs=3, mini_batch_size=32, clip_ratio_high=0.28,
        val_every=4,
    )  # fmt: skip


def train_cpu(
    steps: int = 20, seed: int = 0, run_dir: Path | None = None, console: Console | None = None, **options: Any
) -> TrainOutcome:
    """Train the tiny GPT's specialist on the tickets (``store=``: a SQLite path keeps spans)."""
    run_dir = run_dir or _training.default_run_dir("crew")
    return _training.fit(
        cpu_config(steps, seed, run_dir), crew_agent, tasks(CPU_REPLY_TOKENS), tasks(CPU_REPLY_TOKENS),
        instrumentation=agentlightning_crewai,
        # CrewAI's kickoff is Python work under the GIL: a second runner process puts the machine's second core to
        # work (10 steps of the earlier 4-token setup: 141 s instead of 210 s on 2 cores; README).
        run_dir=run_dir, n_runners=16, runner_processes=2, console=console, **options,
    )  # fmt: skip


def train_gpu(model: str, *, backend: str, steps: int, seed: int, run_dir: Path, console: Console) -> TrainOutcome:
    """Train a Hugging Face model's specialist calls (``model``: id or local path) on a GPU, torch or verl backend."""
    config = _training.gpu_config(
        model, backend=backend, steps=steps, seed=seed, run_dir=run_dir, agents=TRAINED_AGENTS, tasks_per_step=12,
        max_prompt_tokens=2048, max_response_tokens=256,
    )  # fmt: skip
    return _training.fit(
        config, crew_agent, tasks(), tasks(), instrumentation=agentlightning_crewai, run_dir=run_dir,
        store=str(run_dir / "store.db"), n_runners=32, console=console,
    )  # fmt: skip


def fake_reply(request: Any) -> Any:
    """The fake upstream's scripted crew: the specialist calls its directory tool (a native tool call), then routes;
    the others answer."""
    from agentlightning.testing.fake_openai import FakeReply, FakeToolCall

    system = next((str(m.get("content", "")) for m in request.messages if m.get("role") == "system"), "")
    if system.startswith("You are specialist") and not request.has_tool_results:
        return FakeReply(tool_calls=[FakeToolCall("team_directory", "{}")])
    if system.startswith("You are specialist"):
        return FakeReply(text=next(t for r, t in TICKETS if r in str(request.messages)))
    if system.startswith("You are planner"):
        return FakeReply(text="read the ticket and pick the team")
    return FakeReply(text="the routing is right")


async def dev_async(
    n_tasks: int = 2, *, run_dir: Path | None = None, console: Console | None = None
) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` tickets once against the fake upstream through the LLM proxy; print each span tree."""
    del run_dir  # nothing to keep: the tickets are in this file
    return await run_dev(
        crew_agent, tasks(), fake_reply, n_tasks=n_tasks, instrumentation=agentlightning_crewai, console=console,
        timeout_s=120,
    )  # fmt: skip


# The command line (``examples/_cli.py``): CPU training by default, ``--model`` for a GPU, ``--dev``.
COMMAND = ExampleCommand(
    "crew",
    "Train the support desk's specialist (CrewAI) with LightningRL.",
    "routing accuracy",
    20,
    train_cpu,
    train_gpu,
    dev_async,
)

if __name__ == "__main__":
    COMMAND.main()
