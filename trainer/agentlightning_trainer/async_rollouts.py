"""Asynchronous rollouts for LightningRL (``mode="async"``): runners keep working while the learner updates.

A :class:`RolloutPipeline` keeps whole task groups (K rollouts of one task, one GRPO group) queued in the store and
hands the learner finished groups, in the order they finish. Two rules bound how stale a trained sample can be:

* **Issue budget** (as AReaL's): after ``d`` finished steps at most ``(d + max_staleness + 1) x tasks_per_step``
  groups are issued (groups dropped as stale give their place back). A group issued after step ``d`` is served by
  weights of version ``d`` or later and is normally trained by step ``d + max_staleness + 1``, so the bound rarely
  has to drop anything; with ``max_staleness=0`` nothing is issued while the learner updates (the synchronous
  schedule).
* **Staleness filter**: a group is trained only when every one of its samples was served by a policy at most
  ``max_staleness`` versions behind the learner (the version each LLM call recorded from the policy server's
  ``x-agentlightning-policy-version`` header). Otherwise the whole group is dropped, counted and logged, so a GRPO
  group is never split and never mixes versions further apart than the bound.

Within the bound no extra correction is applied: the policy loss's ratio is taken against the logprobs the serving
policy recorded, so a sample from an older version is already importance-weighted (and clipped) by the PPO ratio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning.store.base import LightningStore
from agentlightning.types import Rollout, RolloutConfig, RolloutRequest
from agentlightning_trainer.batches import ProxyEndpoint, StepBatch, collect_batch

logger = logging.getLogger(__name__)

__all__ = ["AsyncStepBatch", "RolloutPipeline", "group_staleness"]


@dataclass
class _Group:
    """One issued task group: its rollouts and the learner's state when it was issued."""

    group_id: str
    rollout_ids: list[str]
    issued_version: int
    deadline: float = 0.0  # monotonic time after which its unfinished rollouts are cancelled
    finished: set[str] = field(default_factory=set[str])


@dataclass
class AsyncStepBatch:
    """What the pipeline hands one step: the batch to train on and how stale it was."""

    batch: StepBatch
    rollouts: list[Rollout] = field(default_factory=list[Rollout])
    staleness: dict[int, int] = field(default_factory=dict[int, int])
    stale_groups_dropped: int = 0
    stale_rollouts_dropped: int = 0
    wait_s: float = 0.0  # how long the learner waited with no finished group to read


def group_staleness(batch: StepBatch, version: int, issued_version: int) -> list[int]:
    """Versions behind ``version`` of each transition of ``batch``; a call that recorded no version counts as served
    by the version current when its group was issued (the oldest it can be)."""
    return [version - (t.policy_version if t.policy_version is not None else issued_version) for t in batch.transitions]


class RolloutPipeline:
    """Keeps task groups running in the store within the staleness budget and yields finished ones (module doc)."""

    def __init__(
        self,
        store: LightningStore,
        tasks: Sequence[Any],
        rng: random.Random,
        *,
        adapter: Any,
        proxy: ProxyEndpoint,
        tasks_per_step: int,
        samples_per_task: int,
        max_staleness: int,
        rollout_config: RolloutConfig,
        max_prompt_tokens: int | None,
        resources_id: str,
        version: int = 0,
    ) -> None:
        """Nothing is enqueued until :meth:`start`; ``resources_id`` is the snapshot new groups run with."""
        self.store = store
        self.tasks = list(tasks)
        self.rng = rng
        self.adapter = adapter
        self.proxy = proxy
        self.tasks_per_step = tasks_per_step
        self.samples_per_task = samples_per_task
        self.max_staleness = max_staleness
        self.rollout_config = rollout_config
        self.max_prompt_tokens = max_prompt_tokens
        self.resources_id = resources_id
        self.version = version
        self.steps_done = 0
        self.issued = 0  # groups issued, minus those dropped as stale (they return their place in the budget)
        self._order: list[Any] = []
        self._ready: asyncio.Queue[tuple[_Group, list[Rollout]]] = asyncio.Queue()
        self._collector: asyncio.Task[None] | None = None
        self._in_flight: dict[str, _Group] = {}
        self._waiting: dict[str, _Group] = {}  # issued groups not yet all terminal
        self._fill_lock = asyncio.Lock()
        self._closed = False

    @property
    def budget(self) -> int:
        """How many groups may have been issued (net of drops) by now."""
        return (self.steps_done + self.max_staleness + 1) * self.tasks_per_step

    @property
    def in_flight_ids(self) -> list[str]:
        """Rollouts of groups issued and not yet handed to the learner or dropped."""
        return [rid for group in self._in_flight.values() for rid in group.rollout_ids]

    async def start(self) -> None:
        """Issue the first ``(max_staleness + 1) x tasks_per_step`` groups and start watching them finish."""
        await self._fill()
        self._collector = asyncio.create_task(self._collect(), name="agl-async-rollouts")

    async def step_done(self, version: int, resources_id: str | None = None) -> None:
        """The learner finished a step and now serves ``version``: widen the budget and issue groups into it."""
        self.steps_done += 1
        self.version = version
        if resources_id is not None:
            self.resources_id = resources_id
        await self._fill()

    async def next_batch(self, version: int) -> AsyncStepBatch:
        """Wait for ``tasks_per_step`` finished groups no older than the bound (older ones are dropped whole)."""
        self.version = version
        out = AsyncStepBatch(StepBatch())
        taken = 0
        while taken < self.tasks_per_step:
            t0 = time.perf_counter()
            ready = [await self._ready.get()]
            out.wait_s += time.perf_counter() - t0  # blocked with nothing to read: the learner is idle
            while len(ready) < self.tasks_per_step - taken and not self._ready.empty():
                ready.append(self._ready.get_nowait())
            # Proxy spans are written off the request path: flush once for all the groups about to be read.
            await self.proxy.flush()
            for group, rollouts in ready:
                self._in_flight.pop(group.group_id, None)
                batch = await collect_batch(
                    self.store, rollouts, self.adapter, max_prompt_tokens=self.max_prompt_tokens
                )
                lags = group_staleness(batch, version, group.issued_version)
                if lags and max(lags) > self.max_staleness:
                    out.stale_groups_dropped += 1
                    out.stale_rollouts_dropped += len(rollouts)
                    self.issued -= 1
                    logger.info(
                        "group %s dropped: a sample is %d versions behind the learner (max_staleness %d)",
                        group.group_id, max(lags), self.max_staleness,
                    )  # fmt: skip
                    continue
                taken += 1
                out.rollouts.extend(rollouts)
                out.batch.transitions.extend(batch.transitions)
                out.batch.rewards_by_group.update(batch.rewards_by_group)
                out.batch.failed += batch.failed
                out.batch.rollout_ids.extend(batch.rollout_ids)
                for lag in lags:
                    out.staleness[lag] = out.staleness.get(lag, 0) + 1
            if out.stale_groups_dropped:
                await self._fill()  # dropped groups gave their places back
        return out

    async def _fill(self) -> None:
        """Issue groups up to the budget, all in one enqueue."""
        async with self._fill_lock:
            n = self.budget - self.issued
            if n <= 0 or self._closed:
                return
            groups: list[tuple[_Group, Any]] = []
            requests: list[RolloutRequest] = []
            for _ in range(n):
                task = self._next_task()
                group = _Group(f"train-v{self.version}-{uuid.uuid4().hex[:8]}", [], self.version)
                groups.append((group, task))
                requests.extend(
                    RolloutRequest(
                        input=task, mode="train", group_id=group.group_id, resources_id=self.resources_id,
                        config=self.rollout_config,
                    )
                    for _ in range(self.samples_per_task)
                )  # fmt: skip
            enqueued = await self.store.enqueue_rollouts(requests)
            self.issued += n
            deadline = time.monotonic() + self._wait_limit_s()
            for index, (group, _) in enumerate(groups):
                start = index * self.samples_per_task
                group.rollout_ids = [r.rollout_id for r in enqueued[start : start + self.samples_per_task]]
                group.deadline = deadline
                self._in_flight[group.group_id] = group
                self._waiting[group.group_id] = group

    def _next_task(self) -> Any:
        """The next task of whole shuffled passes over the set, as the synchronous loop picks them."""
        if not self._order:
            self._order = list(self.tasks)
            self.rng.shuffle(self._order)
        return self._order.pop(0)

    def _wait_limit_s(self) -> float:
        """How long a group may take: every attempt its whole time limit, plus a margin (as the synchronous loop)."""
        return (self.rollout_config.timeout_s or 300.0) * self.rollout_config.max_attempts + 30

    async def _collect(self, poll_s: float = 0.05) -> None:
        """Queue each group for the learner once all its rollouts are terminal (cancelling any past the deadline).

        One waiter for every group in flight: a waiter per group would each re-query the store on every change it
        is notified of (every span and heartbeat), which cost the trainer's process more CPU than the learner had.
        """
        while not self._closed:  # besides the cancel from close(): a cancel lost in a library must not hang it
            try:
                await self._collect_once(poll_s)
            except Exception:  # a store hiccup must not strand the learner waiting on groups nobody watches
                logger.warning("async rollouts: checking for finished groups failed; retrying", exc_info=True)
                await asyncio.sleep(poll_s)

    async def _collect_once(self, poll_s: float) -> None:
        """One look at the groups in flight (waiting up to ``poll_s`` for changes)."""
        pending = [rid for g in self._waiting.values() for rid in g.rollout_ids if rid not in g.finished]
        if not pending:
            await asyncio.sleep(poll_s)
            return
        # Returns at the timeout (or when all are terminal) with the rollouts terminal by then.
        done = await self.store.wait_for_rollouts(pending, timeout_s=poll_s)
        terminal = {r.rollout_id: r for r in done}
        now = time.monotonic()
        for group in list(self._waiting.values()):
            group.finished.update(rid for rid in group.rollout_ids if rid in terminal)
            if len(group.finished) < len(group.rollout_ids) and now > group.deadline:
                for rollout_id in set(group.rollout_ids) - group.finished:
                    logger.warning("rollout %s did not finish in time; cancelled and scored as failed", rollout_id)
                    with contextlib.suppress(Exception):  # it may finish between the wait and the cancel
                        await self.store.cancel_rollout(rollout_id)
                    group.finished.add(rollout_id)
            if len(group.finished) == len(group.rollout_ids):
                del self._waiting[group.group_id]
                rollouts = await self.store.query_rollouts(rollout_ids=group.rollout_ids)
                await self._ready.put((group, rollouts))

    async def close(self, timeout_s: float) -> list[str]:
        """Stop issuing, cancel the groups' rollouts no runner claimed yet, and wait up to ``timeout_s`` for the
        running ones to finish (so none is left half-done in the store); returns the ids of the cancelled ones."""
        self._closed = True
        ids = self.in_flight_ids
        cancelled: list[str] = []
        if ids:
            queued = [
                r.rollout_id for r in await self.store.query_rollouts(rollout_ids=ids, status=["queuing", "requeuing"])
            ]
            # All at once: one a runner claims between the query and its cancel is cancelled mid-run (the store
            # then refuses that attempt's result, so it still finishes at most once).
            results = await asyncio.gather(*(self.store.cancel_rollout(rid) for rid in queued), return_exceptions=True)
            cancelled = [
                rid for rid, result in zip(queued, results, strict=True) if not isinstance(result, BaseException)
            ]
            await self.store.wait_for_rollouts(ids, timeout_s=timeout_s)
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
        return cancelled
