"""The baseline (dev) algorithm: run every task once, wait, and report — no training.

It is the algorithm behind ``Trainer.dev`` and ``agl dev``, and the default of :class:`~agentlightning.Trainer` when
none is given: a way to check the loop end to end (queue, runners, spans, rewards) before spending compute on RL.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentlightning.algorithm import Algorithm
from agentlightning.store.base import LightningStore
from agentlightning.types import Rollout, RolloutConfig, RolloutMode, RolloutRequest

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class ModeSummary:
    """Outcome counts and mean primary reward of one mode's rollouts (train or val)."""

    rollouts: int = 0
    by_status: dict[str, int] = field(default_factory=dict[str, int])
    rewards: list[float] = field(default_factory=list[float])

    @property
    def mean_reward(self) -> float | None:
        """Mean final reward over the rollouts that have one."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


async def rollout_reward(store: LightningStore, rollout_id: str) -> float | None:
    """The primary value of the last reward span of a rollout's latest attempt, or None."""
    from agentlightning.emit import final_reward
    from agentlightning.semconv import SPAN_REWARD

    spans = await store.query_spans(rollout_id, "latest", name=SPAN_REWARD)
    return final_reward(spans)


class BaselineAlgorithm(Algorithm):
    """Enqueue the train and val tasks once each, wait until every rollout ends, print a summary table.

    After :meth:`run`, :attr:`rollouts` holds the final state of every rollout it enqueued (train first) and
    :attr:`summary` the counts per mode.
    """

    def __init__(
        self,
        *,
        timeout_s: float | None = None,
        heartbeat_timeout_s: float | None = None,
        max_attempts: int = 1,
        wait_timeout_s: float | None = None,
        console: Console | None = None,
        show_progress: bool = True,
    ) -> None:
        self.config = RolloutConfig(
            timeout_s=timeout_s, heartbeat_timeout_s=heartbeat_timeout_s, max_attempts=max_attempts
        )
        self.wait_timeout_s = wait_timeout_s
        self.console = console
        self.show_progress = show_progress
        self.rollouts: list[Rollout] = []
        self.summary: dict[str, ModeSummary] = {}

    def _requests(self, tasks: Sequence[Any] | None, mode: RolloutMode) -> list[RolloutRequest]:
        # One group per task: a later algorithm that repeats tasks keeps GRPO groups; here each group has one.
        return [
            RolloutRequest(input=task, mode=mode, group_id=f"g-{uuid.uuid4().hex}", config=self.config)
            for task in tasks or ()
        ]

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Enqueue, wait for every rollout to end (or ``wait_timeout_s``), then summarise."""
        from rich.console import Console

        console = self.console or Console()
        requests = self._requests(train_tasks, "train") + self._requests(val_tasks, "val")
        if not requests:
            console.print("[yellow]baseline: no tasks given; nothing to run[/yellow]")
            return
        enqueued = await store.enqueue_rollouts(requests)
        ids = [r.rollout_id for r in enqueued]
        await self._wait(store, ids, console)
        self.rollouts = await store.query_rollouts(rollout_ids=ids)
        order = {rollout_id: i for i, rollout_id in enumerate(ids)}
        self.rollouts.sort(key=lambda r: order[r.rollout_id])
        rewards = await asyncio.gather(*(rollout_reward(store, r.rollout_id) for r in self.rollouts))
        self.summary = {}
        for rollout, reward in zip(self.rollouts, rewards, strict=True):
            mode = self.summary.setdefault(rollout.mode or "train", ModeSummary())
            mode.rollouts += 1
            mode.by_status[rollout.status] = mode.by_status.get(rollout.status, 0) + 1
            if reward is not None:
                mode.rewards.append(reward)
        self._print_summary(console)

    async def _wait(self, store: LightningStore, ids: list[str], console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        deadline = None if self.wait_timeout_s is None else time.monotonic() + self.wait_timeout_s
        pending = set(ids)
        with Progress(
            TextColumn("rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not self.show_progress,
        ) as progress:
            bar = progress.add_task("rollouts", total=len(ids))
            while pending:
                if deadline is not None and time.monotonic() >= deadline:
                    console.print(
                        f"[yellow]baseline: stopped waiting after {self.wait_timeout_s} s with {len(pending)} "
                        "rollouts unfinished (are runners consuming this store?)[/yellow]"
                    )
                    return
                done = await store.wait_for_rollouts(sorted(pending), timeout_s=0.5)
                pending.difference_update(r.rollout_id for r in done)
                progress.update(bar, completed=len(ids) - len(pending))

    def _print_summary(self, console: Console) -> None:
        from rich.table import Table

        table = Table(title="baseline run")
        for column in ("mode", "rollouts", "succeeded", "failed", "other", "mean reward"):
            table.add_column(column, justify="left" if column == "mode" else "right")
        for mode, summary in self.summary.items():
            succeeded = summary.by_status.get("succeeded", 0)
            failed = summary.by_status.get("failed", 0)
            mean = summary.mean_reward
            table.add_row(
                mode,
                str(summary.rollouts),
                str(succeeded),
                str(failed),
                str(summary.rollouts - succeeded - failed),
                "-" if mean is None else f"{mean:.4f}",
            )
        console.print(table)
