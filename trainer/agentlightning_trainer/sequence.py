"""``Sequential``: run several algorithms one after another on one store, e.g. prompt (APO) then weights (RL).

Between steps two things are handed over:

* **resources** — an algorithm that publishes only its own resources (LightningRL publishes ``{"llm": ...}``) still
  runs the agent with the templates the previous step left in the store: every snapshot it adds is merged over the
  non-LLM resources of the latest snapshot at the start of its step;
* **weights** — after :class:`~agentlightning_trainer.sft.SFT`, a :class:`~agentlightning_trainer.LightningRL`
  with ``checkpoint_dir`` set (and ``resume=True``) starts from the fine-tuned weights: SFT writes a step-0
  checkpoint there (with a fresh optimizer using RL's settings).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentlightning.algorithm import Algorithm
from agentlightning.store.base import LightningStore, SortOrder, StoreStatistics
from agentlightning.types import (
    LLM,
    Attempt,
    AttemptStatus,
    ClaimedRollout,
    Resource,
    ResourcesSnapshot,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
)

logger = logging.getLogger(__name__)


class Sequential(Algorithm):
    """Runs ``algorithms`` in order against the same store and tasks (see the module docstring)."""

    def __init__(self, algorithms: Sequence[Algorithm]) -> None:
        """Keep the steps; at least one."""
        if not algorithms:
            raise ValueError("Sequential needs at least one algorithm, e.g. Sequential([APO(...), LightningRL(...)])")
        self.algorithms = list(algorithms)
        for previous, algorithm in zip(self.algorithms, self.algorithms[1:], strict=False):
            _check_weights_handover(previous, algorithm)

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Run each step to its end before starting the next."""
        previous: Algorithm | None = None
        for index, algorithm in enumerate(self.algorithms):
            if previous is not None:
                _hand_over_weights(previous, algorithm)
            latest = await store.get_resources()
            carried = {k: v for k, v in latest.resources.items() if not isinstance(v, LLM)} if latest else {}
            logger.info(
                "Sequential step %d/%d: %s (carrying %s)",
                index + 1, len(self.algorithms), type(algorithm).__name__, sorted(carried) or "nothing",
            )  # fmt: skip
            target = ResourceCarryingStore(store, carried) if carried else store
            await algorithm.run(target, train_tasks, val_tasks)
            previous = algorithm


def _check_weights_handover(previous: Algorithm, algorithm: Algorithm) -> None:
    """SFT → LightningRL needs a checkpoint directory and the same policy spec; checked before anything runs."""
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.sft import SFT

    if not (isinstance(previous, SFT) and isinstance(algorithm, LightningRL)):
        return
    cfg = algorithm.config
    if cfg.checkpoint_dir is None or not cfg.resume:
        raise ValueError(
            "LightningRL after SFT starts from the fine-tuned weights only through a checkpoint: give it "
            "LightningRLConfig(checkpoint_dir=<empty dir>, resume=True)"
        )
    if cfg.policy != previous.config.policy:
        raise ValueError("LightningRL after SFT needs SFT's PolicySpec (the weights must fit the same model)")


def _hand_over_weights(previous: Algorithm, algorithm: Algorithm) -> None:
    """SFT → LightningRL: write the fine-tuned weights where LightningRL resumes from."""
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.sft import SFT

    if not (isinstance(previous, SFT) and isinstance(algorithm, LightningRL)):
        return
    cfg = algorithm.config
    assert cfg.checkpoint_dir is not None  # checked in Sequential.__init__
    path = previous.write_rl_checkpoint(cfg.checkpoint_dir, cfg)
    logger.info("Sequential: SFT weights (version %d) handed to LightningRL as %s", previous.version, path)


class ResourceCarryingStore(LightningStore):
    """A view of a store whose new snapshots also hold ``carried`` resources (overridden by what is published)."""

    def __init__(self, inner: LightningStore, carried: Mapping[str, Resource]) -> None:
        """Delegate everything to ``inner``; only :meth:`add_resources` changes."""
        self.inner = inner
        self.carried = dict(carried)

    async def add_resources(self, resources: Mapping[str, Resource]) -> ResourcesSnapshot:
        """Store ``carried`` overridden by ``resources`` as the new latest snapshot."""
        return await self.inner.add_resources({**self.carried, **resources})

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Delegated."""
        return await self.inner.enqueue_rollouts(requests)

    async def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None
    ) -> ClaimedRollout | None:
        """Delegated."""
        return await self.inner.claim_rollout(worker_id, timeout_s=timeout_s)

    async def start_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Delegated."""
        return await self.inner.start_attempt(rollout_id, attempt_id)

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, *, error: str | None = None
    ) -> Attempt:
        """Delegated."""
        return await self.inner.finish_attempt(rollout_id, attempt_id, status, error=error)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Delegated."""
        return await self.inner.cancel_rollout(rollout_id)

    async def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Delegated."""
        return await self.inner.update_rollout_metadata(rollout_id, metadata)

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Delegated."""
        return await self.inner.heartbeat(rollout_id, attempt_id)

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Delegated."""
        return await self.inner.add_spans(spans)

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Delegated."""
        return await self.inner.query_spans(
            rollout_id, attempt_id, name=name, after_sequence_id=after_sequence_id, limit=limit, offset=offset
        )

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """Delegated."""
        return await self.inner.get_rollout(rollout_id)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        group_id: str | None = None,
        sort: SortOrder = "asc",
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Delegated."""
        return await self.inner.query_rollouts(
            status=status, mode=mode, rollout_ids=rollout_ids, group_id=group_id, sort=sort, limit=limit,
            offset=offset,
        )  # fmt: skip

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Delegated."""
        return await self.inner.query_attempts(rollout_id)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Delegated."""
        return await self.inner.wait_for_rollouts(rollout_ids, timeout_s=timeout_s)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """Delegated."""
        return await self.inner.get_resources(resources_id)

    async def list_resources(self) -> list[ResourcesSnapshot]:
        """Delegated."""
        return await self.inner.list_resources()

    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Delegated."""
        return await self.inner.check_timeouts(now)

    async def statistics(self) -> StoreStatistics:
        """Delegated."""
        return await self.inner.statistics()

    async def close(self) -> None:
        """Nothing: the inner store belongs to whoever opened it."""
