"""Trainer: fit in one process on the embedded SQLite store, the dev loop, and split roles over HTTP."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentlightning.algorithm import Algorithm
from agentlightning.algorithms import BaselineAlgorithm
from agentlightning.server import StoreServer
from agentlightning.store import InMemoryLightningStore
from agentlightning.store.base import LightningStore
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.trainer import Trainer
from agentlightning.types import LLM
from tests.core.runner.agents import counting


def quiet_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def test_fit_uses_an_embedded_sqlite_store_and_baseline(tmp_path: Path) -> None:
    console, out = quiet_console()
    algorithm = BaselineAlgorithm(console=console)
    trainer = Trainer(algorithm, n_runners=4, run_dir=tmp_path, console=console)
    trainer.fit(counting, [{"i": i} for i in range(20)], [{"i": i} for i in range(100, 105)])

    assert algorithm.summary["train"].by_status == {"succeeded": 20}
    assert algorithm.summary["val"].by_status == {"succeeded": 5}
    assert algorithm.summary["train"].mean_reward == sum(i % 7 for i in range(20)) / 20
    (db,) = tmp_path.glob("*/store.db")  # runs/<timestamp>/store.db under the run directory
    assert trainer.runner_stats is not None and trainer.runner_stats.succeeded == 25

    async def reopen() -> list[str]:
        store = SqliteLightningStore(db)
        try:
            return [r.status for r in await store.query_rollouts()]
        finally:
            await store.close()

    assert asyncio.run(reopen()) == ["succeeded"] * 25
    assert "baseline run" in out.getvalue()


def test_dev_reports_each_rollout() -> None:
    console, out = quiet_console()
    rows = Trainer(n_runners=2, console=console).dev(counting, [{"i": 3}, {"i": 4}])
    assert [(r.status, r.spans, r.rewards, r.final_reward) for r in rows] == [
        ("succeeded", 3, 1, 3.0),
        ("succeeded", 3, 1, 4.0),
    ]
    assert "what the trainer would see" in out.getvalue()


class PublishThenRun(Algorithm):
    """Publishes an LLM, enqueues the tasks pinned to it, waits: the shape of a real algorithm's step."""

    def __init__(self) -> None:
        self.statuses: list[str] = []

    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any] | None = None, val_tasks: Sequence[Any] | None = None
    ) -> None:
        snapshot = await store.add_resources({"llm": LLM(base_url="http://127.0.0.1:9/v1", model="policy-v1")})
        ids = [
            (await store.enqueue_rollout(t, resources_id=snapshot.resources_id)).rollout_id for t in train_tasks or ()
        ]
        done = await store.wait_for_rollouts(ids, timeout_s=30)
        self.statuses = [r.status for r in done]


async def test_algorithm_and_runner_roles_share_a_store_over_http() -> None:
    models: list[str] = []

    async def agent(task: dict[str, int], llm: LLM) -> float:
        models.append(llm.model)
        return float(task["i"])

    with StoreServer(InMemoryLightningStore()) as server:
        runner_side = Trainer(store=server.url, n_runners=3, role="runner")
        runners = asyncio.create_task(runner_side.fit_async(agent))
        algorithm = PublishThenRun()
        await Trainer(algorithm, store=server.url, role="algorithm").fit_async(None, [{"i": i} for i in range(12)])
        runner_side.stop()
        await asyncio.wait_for(runners, 10)

    assert algorithm.statuses == ["succeeded"] * 12
    assert models == ["policy-v1"] * 12
    assert runner_side.runner_stats is not None and runner_side.runner_stats.succeeded == 12


def test_dev_shows_transitions_of_calls_through_the_proxy() -> None:
    from agentlightning.proxy import ProxyServer
    from agentlightning.testing import FakeOpenAI

    async def agent(task: dict[str, str], llm: LLM) -> float:
        import httpx

        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{llm.base_url}/chat/completions",
                json={"model": llm.model, "messages": [{"role": "user", "content": task["q"]}]},
            )
        answer = response.json()["choices"][0]["message"]["content"]
        return 1.0 if answer == "4" else 0.0

    store = InMemoryLightningStore()
    with FakeOpenAI(reply="4").serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        asyncio.run(store.add_resources({"llm": LLM(base_url=proxy.url, model="fake-model", proxied=True)}))
        console, out = quiet_console()
        rows = Trainer(store=store, n_runners=2, console=console).dev(agent, [{"q": "2+2?"}, {"q": "3+1?"}])

    assert [(r.status, r.final_reward, r.transitions, r.transitions_with_token_ids) for r in rows] == [
        ("succeeded", 1.0, 1, 1),
        ("succeeded", 1.0, 1, 1),
    ]
    assert "no transitions" not in out.getvalue()


def test_store_specs_open_the_backend_they_name_and_unknown_schemes_are_refused(tmp_path: Path) -> None:
    """`Trainer(store="postgresql://...")` used to train into a SQLite file named `postgresql:/user@localhost/agl`."""
    from agentlightning.store import open_store
    from agentlightning.store.postgres import PostgresLightningStore

    store = open_store("postgresql://user@localhost/agl")  # connects lazily: nothing is reached here
    assert isinstance(store, PostgresLightningStore)
    sqlite = open_store(f"sqlite:///{tmp_path}/a/store.db")
    assert isinstance(sqlite, SqliteLightningStore)
    asyncio.run(sqlite.close())
    assert (tmp_path / "a" / "store.db").parent.is_dir()
    with pytest.raises(ValueError, match="unknown scheme 'redis'"):
        open_store("redis://localhost:6379")
    assert not Path("redis:").exists() and not Path("postgresql:").exists()
