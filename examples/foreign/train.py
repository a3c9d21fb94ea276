"""Train the ticket router of ``agent.py`` from its OpenInference traces alone. Only this file knows Agent Lightning.

The agent runs as its own program would: in its own process, traced by OpenInference and exported by the stock
OTLP/HTTP exporter, configured by environment variables. The wiring is:

* a store server (``agl store`` in a deployment; :class:`~agentlightning.server.StoreServer` here) that receives
  the agent's spans on ``POST /v1/traces``;
* a ``@rollout`` function that runs one agent run per rollout in a warm worker process, with
  ``OTEL_RESOURCE_ATTRIBUTES=agentlightning.rollout_id=…,agentlightning.attempt_id=…`` (how the store files the
  spans: docs/foreign_traces.md), ``OPENAI_BASE_URL`` at the LLM proxy's plain ``/v1`` route (it forwards to the
  policy server and records nothing, so the OpenInference span is the call's only record, as with a model served
  anywhere else), and returns 1 when the team is right;
* ``Trainer.fit`` with LightningRL, which re-tokenises the recorded calls with the tiny GPT's tokenizer
  (``retokenize="matching"``: the recorded usage must equal the re-tokenised lengths) and trains on them.

    python -m examples.foreign.train          # CPU: the tiny GPT learns to route tickets (about a minute)
    python -m examples.foreign.train --dev    # one pass against a fake upstream; span trees printed
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from agentlightning import LLM, rollout
from agentlightning.server import StoreServer
from agentlightning.store import open_store
from agentlightning.types import Attempt, ResourcesSnapshot, Rollout
from agentlightning_trainer import LightningRLConfig
from examples import _training
from examples._cli import ExampleCommand
from examples._dev import run_dev
from examples._training import TrainOutcome
from examples.foreign import agent, tickets

NO_INSTRUMENTATION = SimpleNamespace(instrument=lambda: None, uninstrument=lambda: None)
"""The agent traces itself (OpenInference, in its own process): nothing to install in the runner."""


def _warm_up() -> None:
    """Import the agent's libraries once per worker process, so each run pays only for its own work."""
    import openai  # noqa: F401  # pyright: ignore[reportUnusedImport]
    import openinference.instrumentation.openai  # noqa: F401  # pyright: ignore[reportUnusedImport]
    import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401  # pyright: ignore[reportUnusedImport]


@contextmanager
def agent_workers(n: int = 4) -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """``n`` worker processes, each running one agent run at a time (``agent.traced_run``), warmed up."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the trainer's state inherited
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=context, initializer=_warm_up) as workers:
        yield workers


def agent_environment(llm: LLM, rollout: Rollout, attempt: Attempt, store_url: str) -> dict[str, str]:
    """The variables an agent run is started with: its model and the OTel settings that file its spans."""
    return {
        # The proxy's plain route: forwarded to the model, no span recorded (no token ids anywhere).
        "OPENAI_BASE_URL": llm.base_url_for(None, None),
        "OPENAI_API_KEY": llm.api_key or "unused",
        "ROUTER_MODEL": llm.model,
        "ROUTER_TEMPERATURE": str(llm.sampling.get("temperature", 0.0)),
        "ROUTER_MAX_TOKENS": str(llm.sampling.get("max_tokens", 8)),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{store_url.rstrip('/')}/v1/traces",
        "OTEL_RESOURCE_ATTRIBUTES": (
            f"agentlightning.rollout_id={rollout.rollout_id},agentlightning.attempt_id={attempt.attempt_id}"
        ),
        "OTEL_SERVICE_NAME": "ticket-router",
    }


def make_agent(workers: concurrent.futures.Executor, store_url: str) -> Any:
    """The rollout function: one traced agent run in a worker; reward 1 when it names the ticket's team."""

    @rollout(name="ticket-router")
    async def ticket_router(
        task: dict[str, Any], rollout: Rollout, attempt: Attempt, resources: ResourcesSnapshot
    ) -> float:
        llm = resources.resources["llm"]
        assert isinstance(llm, LLM)  # the trainer publishes its policy as "llm"
        environ = agent_environment(llm, rollout, attempt, store_url)
        team = await asyncio.wrap_future(workers.submit(agent.traced_run, task["ticket"], environ))
        return 1.0 if team == task["team"] else 0.0

    return ticket_router


def vocabulary() -> tuple[str, ...]:
    """Whole-word tokens of the tiny GPT: the teams first (one token each), then every word of the prompt and
    tickets."""
    texts = [agent.SYSTEM_PROMPT, *(t for t, _ in tickets.TRAIN + tickets.VAL)]
    return _training.tiny_gpt_words(texts, whole=agent.TEAMS)


def cpu_config(steps: int = 20, seed: int = 0, run_dir: Path | None = None, **settings: Any) -> LightningRLConfig:
    """The CPU settings: the tiny GPT replying with one team token, batches sized for a 2-core machine."""
    defaults: dict[str, Any] = {
        "max_seq_len": 128,
        "max_prompt_tokens": 100,
        "reply_words": agent.TEAMS,
        "max_response_tokens": 1,
        "lr": 5e-4,
        "val_every": 5,
        "retokenize": "matching",
    }
    return _training.cpu_config(vocabulary(), steps=steps, seed=seed, run_dir=run_dir, **(defaults | settings))


def train_cpu(
    steps: int = 20,
    seed: int = 0,
    run_dir: Path | None = None,
    console: Console | None = None,
    store: str | None = None,
    n_workers: int = 4,
    **options: Any,
) -> TrainOutcome:
    """Train the tiny GPT from the router's OpenInference spans; validation (greedy) on held-out tickets."""
    run_dir = run_dir or _training.default_run_dir("foreign")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = store or str(run_dir / "store.db")
    config = cpu_config(steps, seed, run_dir, **options.pop("settings", {}))
    with StoreServer(lambda: open_store(path)) as server, agent_workers(n_workers) as workers:
        return _training.fit(
            config, make_agent(workers, server.url), tickets.as_tasks(tickets.TRAIN), tickets.as_tasks(tickets.VAL),
            instrumentation=NO_INSTRUMENTATION, run_dir=run_dir, store=server.url, console=console, **options,
        )  # fmt: skip


def train_gpu(model: str, *, backend: str, steps: int, seed: int, run_dir: Path, console: Console) -> TrainOutcome:
    """Train a Hugging Face model on a GPU from the same traces (validated here; running it needs the GPU)."""
    config = _training.gpu_config(
        model, backend=backend, steps=steps, seed=seed, run_dir=run_dir, max_prompt_tokens=256, max_response_tokens=8
    )
    path = str(run_dir / "store.db")
    with StoreServer(lambda: open_store(path)) as server, agent_workers(8) as workers:
        return _training.fit(
            config, make_agent(workers, server.url), tickets.as_tasks(tickets.TRAIN), tickets.as_tasks(tickets.VAL),
            instrumentation=NO_INSTRUMENTATION, run_dir=run_dir, store=server.url, console=console,
        )  # fmt: skip


async def dev_async(
    n_tasks: int = 2, *, run_dir: Path | None = None, console: Console | None = None
) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` tickets once against a fake upstream that answers each ticket's team; print each span tree."""
    from agentlightning.testing.fake_openai import FakeReply, FakeRequest

    del run_dir  # nothing to keep
    teams = dict(tickets.TRAIN)

    def reply(request: FakeRequest) -> FakeReply:
        return FakeReply(text=teams.get(request.last_user_text, "billing"))

    with tempfile.TemporaryDirectory(prefix="agl-foreign-dev-") as tmp:
        path = str(Path(tmp) / "store.db")
        with StoreServer(lambda: open_store(path)) as server, agent_workers(1) as workers:
            return await run_dev(
                make_agent(workers, server.url), tickets.as_tasks(tickets.TRAIN), reply, n_tasks=n_tasks,
                instrumentation=NO_INSTRUMENTATION, console=console, store=open_store(server.url),
            )  # fmt: skip


# The command line (``examples/_cli.py``): CPU training by default, ``--model`` for a GPU, ``--dev``.
COMMAND = ExampleCommand(
    "foreign",
    "Train an OpenInference-traced ticket router (no Agent Lightning import) with LightningRL.",
    "right team",
    20,
    train_cpu,
    train_gpu,
    dev_async,
)

if __name__ == "__main__":
    COMMAND.main()
