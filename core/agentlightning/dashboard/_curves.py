"""Whole-run aggregates for the reward curves and the resource cards, kept up to date incrementally.

Rewards live in spans, which the store answers only per rollout, so this index walks every rollout once, in enqueue
order, and folds a rollout into per-(mode, snapshot) statistics as soon as nothing about it can change any more
(terminal, and its spans settled: see :data:`agentlightning.dashboard._digest.SETTLE_S`). Each refresh starts after
the longest folded prefix, so the cost of a poll follows the live part of the run, not its length, and the curves
cover the whole run instead of its newest rollouts.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from typing import Final, NamedTuple

from agentlightning.dashboard._digest import DigestCache, RolloutDigest
from agentlightning.dashboard._history import resources_id_of
from agentlightning.dashboard._models import CurvePoint, CurveSeries, CurveStep, RewardCurve
from agentlightning.store.base import LightningStore
from agentlightning.types import Rollout, RolloutStatus

MAX_READS: Final = 5_000
"""Rollout digests one refresh reads at most; past it the answer counts the rollouts still unread."""
RAW_PER_SERIES: Final = 2_000
"""Raw reward points kept per mode; beyond it an evenly spread sample (every k-th rollout) is kept."""
_CHUNK: Final = 500
_REWARDED: Final[frozenset[RolloutStatus]] = frozenset({"succeeded", "failed"})  # cancelled runs are no evidence

SeriesKey = tuple[str, str | None]
"""(mode or "none", resources_id or None)."""


@dataclass(slots=True)
class RewardStats:
    """Count, mean, sum of squared deviations (Welford) and range of one series' rewards at one step."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float) -> None:
        """Fold one reward in (Welford's update: stable for long runs, unlike a running sum of squares)."""
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def merged(self, other: RewardStats) -> RewardStats:
        """Both sets of rewards together (Chan et al.'s pairwise combination)."""
        if not other.count:
            return replace(self)
        if not self.count:
            return replace(other)
        n = self.count + other.count
        delta = other.mean - self.mean
        return RewardStats(
            count=n,
            mean=self.mean + delta * other.count / n,
            m2=self.m2 + other.m2 + delta * delta * self.count * other.count / n,
            low=min(self.low, other.low),
            high=max(self.high, other.high),
        )

    @property
    def stderr(self) -> float:
        """Standard error of the mean (sample standard deviation / sqrt(n)); 0 for a single reward."""
        return math.sqrt(self.m2 / (self.count - 1) / self.count) if self.count > 1 else 0.0


class RawPoint(NamedTuple):
    """One rewarded rollout, for the raw-points view."""

    rollout_id: str
    mode: str
    resources_id: str | None
    reward: float
    status: RolloutStatus


class RawSample:
    """Evenly spread raw points of one series: every ``stride``-th one, the stride doubling each time it fills."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.stride = 1
        self.seen = 0
        self.points: list[RawPoint] = []

    def add(self, point: RawPoint) -> None:
        """Offer the next point of the series."""
        if self.seen % self.stride == 0:
            self.points.append(point)
            if len(self.points) > self.cap:
                # Dropping every other point keeps indices 0, 2s, 4s, ...: the sample stays even over the run.
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1


@dataclass(slots=True)
class RunView:
    """What one refresh of the index knows: folded and live rollouts merged."""

    stats: dict[SeriesKey, RewardStats] = field(default_factory=dict[SeriesKey, RewardStats])
    usage: dict[str, int] = field(default_factory=dict[str, int])
    points: list[RawPoint] = field(default_factory=list[RawPoint])
    points_total: int = 0
    points_stride: int = 1
    scanned: int = 0
    unread: int = 0


class RunIndex:
    """Per-step reward statistics and per-snapshot rollout counts over every rollout of the store."""

    def __init__(
        self, store: LightningStore, cache: DigestCache, *, max_reads: int = MAX_READS, raw_cap: int = RAW_PER_SERIES
    ) -> None:
        self._store = store
        self._cache = cache
        self._max_reads = max_reads
        self._raw_cap = raw_cap
        self._prefix = 0  # leading rollouts (enqueue order) already folded
        self._folded_after: set[str] = set()  # folded rollouts beyond the prefix, behind a live one
        self._stats: dict[SeriesKey, RewardStats] = {}
        self._usage: dict[str, int] = {}
        self._raw: dict[str, RawSample] = {}
        # One refresh at a time: two interleaved scans would fold the same rollout twice.
        self._lock = asyncio.Lock()

    async def view(self) -> RunView:
        """Read what changed since the last refresh and return the whole-run aggregates."""
        async with self._lock:
            return await self._scan()

    async def _scan(self) -> RunView:
        live = RunView()
        position = self._prefix
        advancing = True  # still directly after the folded prefix, so folding extends it
        reads = 0
        while True:
            if reads >= self._max_reads:
                total = (await self._store.statistics()).total_rollouts
                live.unread = max(0, total - position)
                break
            limit = min(_CHUNK, self._max_reads - reads)
            chunk = await self._store.query_rollouts(sort="asc", limit=limit, offset=position)
            position += len(chunk)
            pending = [r for r in chunk if r.rollout_id not in self._folded_after and r.num_attempts > 0]
            digests = dict(zip((r.rollout_id for r in pending), await self._cache.digests(pending), strict=True))
            reads += len(pending)
            for rollout in chunk:
                advancing = self._visit(rollout, digests.get(rollout.rollout_id), advancing, live)
            if len(chunk) < limit:
                break
        live.scanned = position
        return self._merge(live)

    def _visit(self, rollout: Rollout, digest: RolloutDigest | None, advancing: bool, live: RunView) -> bool:
        """Fold a finished rollout or count it as live; returns whether the folded prefix still extends."""
        rollout_id = rollout.rollout_id
        if rollout_id in self._folded_after:
            if advancing:
                self._folded_after.discard(rollout_id)
                self._prefix += 1
            return advancing
        resources_id = resources_id_of(rollout, digest) if digest is not None else rollout.resources_id
        reward = digest.reward if digest is not None else None
        settled = rollout.num_attempts == 0 or (digest is not None and digest.settled)
        if rollout.is_terminal and settled:
            self._fold(rollout, resources_id, reward)
            if advancing:
                self._prefix += 1
            else:
                self._folded_after.add(rollout_id)
            return advancing
        if resources_id is not None:
            live.usage[resources_id] = live.usage.get(resources_id, 0) + 1
        if rollout.status in _REWARDED and reward is not None:
            point = _point(rollout, resources_id, reward)
            live.stats.setdefault((point.mode, resources_id), RewardStats()).add(reward)
            live.points.append(point)
        return False

    def _fold(self, rollout: Rollout, resources_id: str | None, reward: float | None) -> None:
        if resources_id is not None:
            self._usage[resources_id] = self._usage.get(resources_id, 0) + 1
        if rollout.status not in _REWARDED or reward is None:
            return
        point = _point(rollout, resources_id, reward)
        self._stats.setdefault((point.mode, resources_id), RewardStats()).add(reward)
        sample = self._raw.get(point.mode)
        if sample is None:
            sample = self._raw[point.mode] = RawSample(self._raw_cap)
        sample.add(point)

    def _merge(self, live: RunView) -> RunView:
        stats = dict(self._stats)
        for key, extra in live.stats.items():
            stats[key] = stats[key].merged(extra) if key in stats else extra
        usage = dict(self._usage)
        for resources_id, count in live.usage.items():
            usage[resources_id] = usage.get(resources_id, 0) + count
        points = [p for sample in self._raw.values() for p in sample.points] + live.points
        return RunView(
            stats=stats,
            usage=usage,
            points=points,
            points_total=sum(s.seen for s in self._raw.values()) + len(live.points),
            points_stride=max((s.stride for s in self._raw.values()), default=1),
            scanned=live.scanned,
            unread=live.unread,
        )


def _point(rollout: Rollout, resources_id: str | None, reward: float) -> RawPoint:
    return RawPoint(rollout.rollout_id, rollout.mode or "none", resources_id, reward, rollout.status)


BAND: Final = "mean ± 1 standard error"
_MODES: Final = ("train", "val", "test", "none")


def reward_curve(view: RunView, version_of: dict[str, int], *, with_points: bool, refresh_s: float) -> RewardCurve:
    """The curve page's body: one series per mode, one step per resources version, raw points when asked."""
    by_mode: dict[str, dict[int | None, RewardStats]] = {}
    for (mode, resources_id), stats in view.stats.items():
        # Snapshots are immutable, so two ids never share a version; an unknown id joins the no-snapshot step.
        version = version_of.get(resources_id) if resources_id is not None else None
        steps = by_mode.setdefault(mode, {})
        steps[version] = steps[version].merged(stats) if version in steps else stats
    series = [
        CurveSeries(
            mode=mode,
            rollouts=sum(s.count for s in by_mode[mode].values()),
            steps=[
                CurveStep(version=v, count=s.count, mean=s.mean, stderr=s.stderr, low=s.low, high=s.high)
                for v, s in sorted(by_mode[mode].items(), key=lambda item: -1 if item[0] is None else item[0])
            ],
        )
        for mode in _MODES
        if mode in by_mode
    ]
    points = [
        CurvePoint(
            rollout_id=p.rollout_id,
            mode=p.mode,
            status=p.status,
            reward=p.reward,
            resources_version=version_of.get(p.resources_id) if p.resources_id is not None else None,
        )
        for p in (view.points if with_points else [])
    ]
    return RewardCurve(
        series=series,
        band=BAND,
        rewarded=sum(s.rollouts for s in series),
        scanned=view.scanned,
        unread=view.unread,
        points=points,
        points_total=view.points_total,
        points_stride=view.points_stride,
        refresh_s=refresh_s,
    )
