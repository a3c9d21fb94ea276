"""Store-side plumbing shared by APO and SFT: publish resources, run a batch of rollouts, read their outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning.store.base import LightningStore
from agentlightning.types import (
    Resource,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutRequest,
    Transition,
)

logger = logging.getLogger(__name__)


@dataclass
class RolloutOutcome:
    """One finished rollout: its final reward (None when it failed or recorded none) and its selected calls."""

    rollout: Rollout
    reward: float | None
    transitions: list[Transition] = field(default_factory=list[Transition])

    @property
    def task(self) -> Any:
        """The task the rollout ran on."""
        return self.rollout.input


@dataclass
class ServedProxy:
    """An LLM proxy served on the caller's event loop (it shares the store object with runners and algorithm)."""

    app: Any
    url: str
    task: asyncio.Task[None]
    server: Any

    async def flush(self) -> None:
        """Wait until every call recorded so far is in the store."""
        from agentlightning.proxy import flush_proxy_spans

        await flush_proxy_spans(self.app)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def start_proxy(
    store: LightningStore, upstream: str, *, request_token_ids: bool = True, upstream_api_key: str | None = None
) -> ServedProxy:
    """Serve the LLM proxy in front of ``upstream`` on a free loopback port."""
    import uvicorn

    from agentlightning.proxy import create_proxy_app
    from agentlightning_trainer.policy_server import free_port

    app = create_proxy_app(
        store,
        upstream,
        request_token_ids=request_token_ids,
        request_logprobs=request_token_ids,
        upstream_api_key=upstream_api_key,
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    )
    task = asyncio.create_task(server.serve(), name="agl-llm-proxy")
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"the LLM proxy failed to start on port {port}")
        await asyncio.sleep(0.01)
    return ServedProxy(app, f"http://127.0.0.1:{port}", task, server)


async def publish_resources(
    store: LightningStore, resources: Mapping[str, Resource], *, base: Mapping[str, Resource] | None = None
) -> ResourcesSnapshot:
    """Add a snapshot holding ``base`` (e.g. the resources found at start) overridden by ``resources``."""
    return await store.add_resources({**(base or {}), **resources})


async def run_batch(
    store: LightningStore,
    tasks: Sequence[Any],
    *,
    mode: RolloutMode,
    resources_id: str,
    repeat: int = 1,
    group_prefix: str,
    timeout_s: float,
) -> list[Rollout]:
    """Enqueue every task ``repeat`` times (one group per task) with one snapshot, wait; unfinished are cancelled."""
    config = RolloutConfig(timeout_s=timeout_s)
    requests: list[RolloutRequest] = []
    for index, task in enumerate(tasks):
        group = f"{group_prefix}-t{index}-{uuid.uuid4().hex[:8]}"
        requests.extend(
            RolloutRequest(input=task, mode=mode, group_id=group, resources_id=resources_id, config=config)
            for _ in range(repeat)
        )
    if not requests:
        return []
    enqueued = await store.enqueue_rollouts(requests)
    ids = [r.rollout_id for r in enqueued]
    done = {r.rollout_id for r in await store.wait_for_rollouts(ids, timeout_s=timeout_s + 30)}
    for rollout_id in ids:
        if rollout_id not in done:
            logger.warning(
                "rollout %s did not finish within %.0f s; cancelled and scored as failed", rollout_id, timeout_s
            )
            with contextlib.suppress(Exception):  # it may finish between the wait and the cancel
                await store.cancel_rollout(rollout_id)
    rollouts = await store.query_rollouts(rollout_ids=ids)
    order = {rid: i for i, rid in enumerate(ids)}
    return sorted(rollouts, key=lambda r: order[r.rollout_id])


async def read_outcomes(store: LightningStore, rollouts: Sequence[Rollout], adapter: Any) -> list[RolloutOutcome]:
    """Final reward and the adapter's transitions (selected calls, messages) of each rollout."""
    from agentlightning.emit import final_reward

    outcomes: list[RolloutOutcome] = []
    for rollout in rollouts:
        if rollout.status != "succeeded":
            outcomes.append(RolloutOutcome(rollout, None))
            continue
        spans = await store.query_spans(rollout.rollout_id, "latest")
        reward = final_reward(spans)
        transitions = adapter.adapt(rollout, spans) if reward is not None else []
        outcomes.append(RolloutOutcome(rollout, reward, list(transitions)))
    return outcomes


def mean_reward(outcomes: Sequence[RolloutOutcome]) -> float:
    """Mean final reward; failed rollouts and rollouts without a reward count as 0."""
    return sum(o.reward or 0.0 for o in outcomes) / max(1, len(outcomes))
