"""A span sink that holds a running attempt's spans so they travel with its heartbeats and its finish.

Over HTTP every ``add_spans`` is a request, and a short attempt's spans fit in one: a runner that holds them and
sends them with ``finish_attempt_with_spans`` makes two requests per rollout (claim and start, spans and finish)
instead of four. The runner registers each attempt it runs (:meth:`HeldSpanSink.hold`); spans of other attempts,
and of a held attempt past ``max_held`` spans, go to the store at once as before. A held span waits at most one
heartbeat interval: the runner's heartbeat sends the held spans instead of a bare heartbeat (a span counts as one).
While the agent keeps producing spans, a bucket older than ``max_hold_s`` also goes out with the next export, so
a runner killed mid-attempt loses at most that much of its trace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from agentlightning.tracing import SpanSink
from agentlightning.types import Span

DEFAULT_MAX_HELD = 256  # spans of one attempt held at most; more go out at once (bounds memory and request size)
DEFAULT_MAX_HOLD_S = 2.0  # a held bucket older than this goes out with the next export

_Key = tuple[str, str]


class HeldSpanSink:
    """Wraps a sink: spans of held attempts stay here until :meth:`release`; the rest pass straight through."""

    def __init__(
        self, inner: SpanSink, *, max_held: int = DEFAULT_MAX_HELD, max_hold_s: float = DEFAULT_MAX_HOLD_S
    ) -> None:
        """Wrap ``inner``; a held bucket goes out early past ``max_held`` spans or ``max_hold_s`` seconds."""
        if max_held < 1:
            raise ValueError(f"max_held must be at least 1, got {max_held}")
        if max_hold_s <= 0:
            raise ValueError(f"max_hold_s must be positive, got {max_hold_s}")
        self._inner = inner
        self._max_held = max_held
        self._max_hold_s = max_hold_s
        self._since: dict[_Key, float] = {}  # when the oldest span of a non-empty bucket arrived
        self._lock = threading.Lock()  # export runs on the tracer's exporter thread, hold/release on the runner's
        self._held: dict[_Key, list[Span]] = {}

    def hold(self, rollout_id: str, attempt_id: str) -> None:
        """Hold the spans of this attempt from now on (until :meth:`release`)."""
        with self._lock:
            self._held.setdefault((rollout_id, attempt_id), [])

    def take(self, rollout_id: str, attempt_id: str) -> list[Span]:
        """The spans held so far for this attempt (it stays held); [] when none or not held."""
        with self._lock:
            bucket = self._held.get((rollout_id, attempt_id))
            if not bucket:
                return []
            self._held[(rollout_id, attempt_id)] = []
            return bucket

    def put_back(self, rollout_id: str, attempt_id: str, spans: Sequence[Span]) -> bool:
        """Return spans taken but not delivered, ahead of newer ones; False when the attempt is no longer held."""
        with self._lock:
            bucket = self._held.get((rollout_id, attempt_id))
            if bucket is None:
                return False
            if not bucket:
                self._since[(rollout_id, attempt_id)] = time.monotonic()
            self._held[(rollout_id, attempt_id)] = [*spans, *bucket]
            return True

    def release(self, rollout_id: str, attempt_id: str) -> list[Span]:
        """Stop holding this attempt; returns what was held (the caller sends it, e.g. with the finish)."""
        with self._lock:
            self._since.pop((rollout_id, attempt_id), None)
            return self._held.pop((rollout_id, attempt_id), [])

    def export(self, spans: Sequence[Span]) -> None:
        """Keep the spans of held attempts; deliver the others (and overfull buckets) through the wrapped sink."""
        passing: list[Span] = []
        overflow: dict[_Key, list[Span]] = {}
        now = time.monotonic()
        with self._lock:
            for span in spans:
                key = (span.rollout_id, span.attempt_id)
                bucket = self._held.get(key)
                if bucket is None:
                    passing.append(span)
                else:
                    if not bucket:
                        self._since[key] = now
                    bucket.append(span)
            for key, bucket in self._held.items():
                if bucket and (len(bucket) >= self._max_held or now - self._since.get(key, now) >= self._max_hold_s):
                    overflow[key] = bucket
                    self._held[key] = []
        for bucket in overflow.values():
            passing.extend(bucket)
        if not passing:
            return
        try:
            self._inner.export(passing)
        except BaseException:
            # The tracer retries only the batch it gave us; spans taken from the buckets go back where they were.
            for key, bucket in overflow.items():
                self.put_back(*key, bucket)
            raise

    def close(self) -> None:
        """Close the wrapped sink (the tracer calls this on shutdown)."""
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()
