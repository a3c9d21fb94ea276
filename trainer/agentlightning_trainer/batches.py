"""The loop pieces every trainer shares: serve the LLM proxy, publish resources, run K rollouts per task, read them.

LightningRL (torch and verl backends), SFT and APO all go through these functions, so a batch is enqueued, waited
for, cancelled on timeout and read back in one way.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentlightning.store.base import LightningStore
from agentlightning.types import (
    LLM,
    Resource,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutRequest,
    Transition,
)

logger = logging.getLogger(__name__)

LLM_RESOURCE = "llm"
"""The resource name under which the trainers publish the policy's LLM (the agent's ``llm`` parameter)."""


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


class ProxyEndpoint(Protocol):
    """An LLM proxy the trainers point agents at, wherever it runs (this event loop or the policy server process)."""

    url: str

    async def flush(self) -> None:
        """Wait until every call recorded so far is in the store."""
        ...

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        ...


async def publish_resources(
    store: LightningStore, resources: Mapping[str, Resource], *, base: Mapping[str, Resource] | None = None
) -> ResourcesSnapshot:
    """Add a snapshot holding ``base`` (e.g. the resources found at start) overridden by ``resources``."""
    return await store.add_resources({**(base or {}), **resources})


def non_llm_resources(snapshot: ResourcesSnapshot | None) -> dict[str, Resource]:
    """The resources of ``snapshot`` that are not LLMs (prompt templates and the like); empty for None."""
    if snapshot is None:
        return {}
    return {k: v for k, v in snapshot.resources.items() if not isinstance(v, LLM)}


def policy_llm(
    url: str, model: str, version: int, temperature: float, max_tokens: int, agents: Sequence[str] = ()
) -> LLM:
    """The ``LLM`` resource of a trained policy behind the proxy at ``url``, serving weights ``version``;
    ``agents`` with weights of their own are served as ``<model>@<agent>`` (:meth:`LLM.model_for`)."""
    return LLM(
        base_url=url,
        model=model,
        proxied=True,
        weights_version=version,
        sampling={"temperature": temperature, "max_tokens": max_tokens},
        agent_models={agent: agent_model_name(model, agent) for agent in agents},
    )


def agent_model_name(model: str, agent: str) -> str:
    """The model name the policy server serves agent ``agent``'s own weights under."""
    return f"{model}@{agent}"


async def publish_llm(store: LightningStore, llm: LLM, *, name: str = LLM_RESOURCE) -> ResourcesSnapshot:
    """Publish ``llm`` over the latest snapshot's non-LLM resources, so templates another algorithm set survive."""
    return await publish_resources(store, {name: llm}, base=non_llm_resources(await store.get_resources()))


async def run_batch(
    store: LightningStore,
    tasks: Sequence[Any],
    *,
    mode: RolloutMode,
    resources_id: str,
    repeat: int = 1,
    group_prefix: str,
    timeout_s: float,
    config: RolloutConfig | None = None,
) -> list[Rollout]:
    """Enqueue every task ``repeat`` times (one group per task) with one snapshot, wait; unfinished are cancelled.

    ``config`` sets each rollout's limits and retries (default: ``timeout_s`` per attempt, one attempt)."""
    config = config or RolloutConfig(timeout_s=timeout_s)
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
    wait_s = (config.timeout_s or timeout_s) * config.max_attempts + 30  # every attempt may use its whole limit
    done = {r.rollout_id for r in await store.wait_for_rollouts(ids, timeout_s=wait_s)}
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


async def run_policy_batch(
    store: LightningStore,
    tasks: Sequence[Any],
    proxy: ProxyEndpoint,
    llm: LLM,
    *,
    mode: RolloutMode,
    repeat: int,
    group_prefix: str,
    timeout_s: float,
    config: RolloutConfig | None = None,
) -> list[Rollout]:
    """Publish the policy's ``llm`` (see :func:`publish_llm`), run the batch, and flush the calls it recorded."""
    snapshot = await publish_llm(store, llm)
    rollouts = await run_batch(
        store, tasks, mode=mode, resources_id=snapshot.resources_id, repeat=repeat, group_prefix=group_prefix,
        timeout_s=timeout_s, config=config,
    )  # fmt: skip
    await proxy.flush()
    return rollouts


async def read_outcomes(
    store: LightningStore, rollouts: Sequence[Rollout], adapter: Any | None
) -> list[RolloutOutcome]:
    """Final reward and the adapter's transitions of each rollout; with no adapter only the reward spans are read."""
    from agentlightning.emit import final_reward
    from agentlightning.semconv import SPAN_REWARD

    outcomes: list[RolloutOutcome] = []
    for rollout in rollouts:
        if rollout.status != "succeeded":
            outcomes.append(RolloutOutcome(rollout, None))
            continue
        name = SPAN_REWARD if adapter is None else None  # scoring needs the reward spans only
        spans = await store.query_spans(rollout.rollout_id, "latest", name=name)
        reward = final_reward(spans)
        transitions = adapter.adapt(rollout, spans) if reward is not None and adapter is not None else []
        outcomes.append(RolloutOutcome(rollout, reward, list(transitions)))
    return outcomes


@dataclass
class StepBatch:
    """What one training batch yielded: transitions to train on, reward per group, failures."""

    transitions: list[Transition] = field(default_factory=list[Transition])
    rewards_by_group: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    failed: int = 0
    rollout_ids: list[str] = field(default_factory=list[str])


async def collect_batch(
    store: LightningStore, rollouts: Sequence[Rollout], adapter: Any, *, max_prompt_tokens: int | None = None
) -> StepBatch:
    """Transitions of the succeeded rollouts (failed, cancelled and unfinished ones are excluded) and their rewards.

    A row whose call recorded no policy version (a re-tokenised call: foreign spans carry none) gets the weights
    version of the LLM in its rollout's resources snapshot, the version serving when the rollout was issued."""
    batch = StepBatch(rollout_ids=[r.rollout_id for r in rollouts])
    served: dict[str, int | None] = {}  # resources id -> weights version of its policy LLM
    for outcome in await read_outcomes(store, rollouts, adapter):
        if outcome.reward is None:
            batch.failed += 1
            continue
        rollout = outcome.rollout
        batch.rewards_by_group.setdefault(rollout.group_id or rollout.rollout_id, []).append(outcome.reward)
        rows = [
            t
            for t in outcome.transitions
            if t.has_token_ids and (max_prompt_tokens is None or len(t.prompt_token_ids) <= max_prompt_tokens)
        ]
        if rollout.resources_id is not None and any(t.policy_version is None for t in rows):
            if rollout.resources_id not in served:
                served[rollout.resources_id] = served_version(await store.get_resources(rollout.resources_id))
            version = served[rollout.resources_id]
            if version is not None:
                rows = [
                    t if t.policy_version is not None else t.model_copy(update={"policy_version": version})
                    for t in rows
                ]
        batch.transitions.extend(rows)
    return batch


def served_version(snapshot: ResourcesSnapshot | None) -> int | None:
    """Weights version of the policy LLM in ``snapshot``: the one named ``llm``, else its only versioned LLM."""
    if snapshot is None:
        return None
    llm = snapshot.resources.get(LLM_RESOURCE)
    if isinstance(llm, LLM) and llm.weights_version is not None:
        return llm.weights_version
    versions = {r.weights_version for r in snapshot.resources.values() if isinstance(r, LLM)} - {None}
    return versions.pop() if len(versions) == 1 else None


def mean_reward(outcomes: Sequence[RolloutOutcome]) -> float:
    """Mean final reward; failed rollouts and rollouts without a reward count as 0."""
    return sum(o.reward or 0.0 for o in outcomes) / max(1, len(outcomes))
