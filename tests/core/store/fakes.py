"""Test helpers for store suites: a fake clock and span builders (re-exported by ``conformance``)."""

from __future__ import annotations

import time

from agentlightning.types import ClaimedRollout, Span

NS = 1_000_000_000


class FakeClock:
    """A settable clock in nanoseconds since the epoch; pass it as a store's ``clock``."""

    def __init__(self, start_ns: int | None = None) -> None:
        self.now = time.time_ns() if start_ns is None else start_ns

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += int(seconds * NS)


def make_span(claimed: ClaimedRollout, index: int, *, name: str = "step", span_id: str | None = None) -> Span:
    """A small span of the claimed attempt."""
    return Span(
        rollout_id=claimed.rollout.rollout_id,
        attempt_id=claimed.attempt.attempt_id,
        trace_id=f"{1:032x}",
        span_id=span_id or f"{index + 1:016x}",
        name=name,
        start_time=1_000 + index,
        end_time=2_000 + index,
        attributes={"index": index},
    )


def spans_of(claimed: ClaimedRollout, count: int, *, start: int = 0, name: str = "step") -> list[Span]:
    """``count`` spans of the claimed attempt with span ids start+1..start+count."""
    return [make_span(claimed, i, name=name) for i in range(start, start + count)]
