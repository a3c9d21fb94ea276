"""The tracing pipeline: rollout context, a span processor, and batched delivery of spans to a sink (a store).

How spans flow::

    agent thread                          exporter thread (one per tracer)
    span.start ─ on_start: stamp rollout/attempt ids from current_rollout()
    span.end   ─ on_end: enqueue (bounded, never blocks) ──► batch ─► convert to Span ─► sink.export (retried)

- The agent thread only records and enqueues; converting to :class:`~agentlightning.types.Span` happens on the
  exporter thread. ``LightningTracer`` records its own spans with a lean implementation of the OpenTelemetry API
  (:mod:`agentlightning._lean_tracer`: same spans, a fraction of the SDK's per-span cost); on a user's SDK
  ``TracerProvider`` it adds its processor and the SDK records.

- The current rollout lives in a :mod:`contextvars` variable set by :func:`rollout_context`; it follows asyncio
  tasks and threads started with a copied context (``contextvars.copy_context().run`` / ``asyncio.to_thread``).
- A span that ends with no rollout/attempt id (neither set explicitly nor stamped from the context) cannot be
  stored, so it is dropped and counted in :attr:`LightningTracer.unattributed_spans` (no warning: on a user's own
  TracerProvider most spans outside rollouts are not ours to store).
- The agent never waits for the sink. When the queue is full, new spans are dropped and counted; a sink that
  raises is retried a bounded number of times with backoff, then the batch is dropped and counted. The first loss
  of either kind logs one warning on the ``agentlightning.tracing`` logger; later losses are only counted.
- Runners call :meth:`LightningTracer.flush` at the end of each rollout so every span of it reaches the store
  before the attempt is finished.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Generator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span as SdkSpan, SpanProcessor, TracerProvider

from agentlightning import semconv
from agentlightning._lean_tracer import LeanTracerProvider, sdk_settings_in_environment
from agentlightning._loops import close_loop
from agentlightning.otel import span_from_readable
from agentlightning.types.spans import Span

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from agentlightning.store.base import LightningStore

__all__ = [
    "LightningSpanProcessor",
    "LightningTracer",
    "ListSpanSink",
    "RolloutContext",
    "SpanSink",
    "StoreSpanSink",
    "current_rollout",
    "get_lightning_tracer",
    "get_tracer",
    "init_tracing",
    "rollout_context",
    "shutdown_tracing",
]

logger = logging.getLogger("agentlightning.tracing")


# --- rollout context ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RolloutContext:
    """The rollout and attempt whose spans are being recorded."""

    rollout_id: str
    attempt_id: str


_current: ContextVar[RolloutContext | None] = ContextVar("agentlightning_rollout", default=None)


def current_rollout() -> RolloutContext | None:
    """The rollout/attempt of the running code, or None outside :func:`rollout_context`."""
    return _current.get()


@contextlib.contextmanager
def rollout_context(rollout_id: str, attempt_id: str) -> Generator[RolloutContext]:
    """Attribute every span started inside the block (and tasks/threads it spawns with its context) to an attempt."""
    for field, value in (("rollout_id", rollout_id), ("attempt_id", attempt_id)):
        if not isinstance(value, str) or not value:  # pyright: ignore[reportUnnecessaryIsInstance]  # callers may be untyped
            raise ValueError(f"rollout_context: {field} must be a non-empty string, got {value!r}")
    context = RolloutContext(rollout_id, attempt_id)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


# --- sinks ------------------------------------------------------------------------------------------------------
class SpanSink(Protocol):
    """Where finished spans go. Called on the exporter thread, one batch at a time; it may raise or block."""

    def export(self, spans: Sequence[Span]) -> None:
        """Deliver one batch of spans (raise to have it retried)."""
        ...


class ListSpanSink:
    """Keeps exported spans in memory: for tests and local development."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []

    def export(self, spans: Sequence[Span]) -> None:
        """Append the batch."""
        with self._lock:
            self._spans.extend(spans)

    @property
    def spans(self) -> list[Span]:
        """A copy of every span exported so far, in export order."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        """Forget the spans exported so far."""
        with self._lock:
            self._spans.clear()


class StoreSpanSink:
    """Delivers span batches into a :class:`~agentlightning.store.LightningStore` with ``add_spans``.

    By default each exporting thread runs the store's coroutines on its own persistent event loop. Pass ``loop`` to
    run them on the loop that owns the store instead (for stores bound to one loop, such as an async HTTP client
    created inside a running application).
    """

    def __init__(
        self, store: LightningStore, *, loop: asyncio.AbstractEventLoop | None = None, timeout_s: float = 30.0
    ) -> None:
        self._store = store
        self._target_loop = loop
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._own_loops: list[asyncio.AbstractEventLoop] = []
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Span]) -> None:
        """Store the batch; raises what the store raises (the tracer retries or drops)."""
        batch = list(spans)
        if self._target_loop is not None:
            if self._target_loop.is_closed():
                raise RuntimeError("the event loop given to StoreSpanSink is closed; spans cannot reach the store")
            future = asyncio.run_coroutine_threadsafe(self._store.add_spans(batch), self._target_loop)
            try:
                future.result(self._timeout_s)
            except TimeoutError:
                future.cancel()
                raise
            return
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
            with self._lock:
                self._own_loops.append(loop)
        loop.run_until_complete(asyncio.wait_for(self._store.add_spans(batch), self._timeout_s))

    def close(self) -> None:
        """Close the event loops this sink created (the tracer calls this on shutdown)."""
        with self._lock:
            loops, self._own_loops = self._own_loops, []
        for loop in loops:
            if not loop.is_running():
                close_loop(loop)  # a store may have left tasks on it (a PostgreSQL pool's workers)


# --- span processor -----------------------------------------------------------------------------------------------
class LightningSpanProcessor(SpanProcessor):
    """Stamps rollout ids on spans and ships finished ones to a sink in batches from a background thread."""

    def __init__(
        self,
        sink: SpanSink,
        *,
        max_queue_size: int = 8192,
        max_batch_size: int = 512,
        export_interval_s: float = 0.5,
        max_export_retries: int = 3,
        retry_backoff_s: float = 0.1,
    ) -> None:
        for field, value in (("max_queue_size", max_queue_size), ("max_batch_size", max_batch_size)):
            if value < 1:
                raise ValueError(f"{field} must be at least 1, got {value}")
        if export_interval_s <= 0:
            raise ValueError(f"export_interval_s must be positive, got {export_interval_s}")
        if max_export_retries < 0 or retry_backoff_s < 0:
            raise ValueError("max_export_retries and retry_backoff_s must not be negative")
        self._sink = sink
        self._max_queue_size = max_queue_size
        self._max_batch_size = max_batch_size
        self._export_interval_s = export_interval_s
        self._max_export_retries = max_export_retries
        self._retry_backoff_s = retry_backoff_s
        self._lock = threading.Lock()  # guards the queue and the enqueue/drop counters
        self._progress = threading.Condition()  # guards the exporter's counters; flush waits on it
        self.dropped_spans = 0
        self.unattributed_spans = 0
        self.exported_spans = 0
        self.failed_exports = 0
        self._start_worker()
        _live_processors.add(self)

    def _start_worker(self) -> None:
        self._queue: deque[ReadableSpan] = deque()
        self._enqueued = 0
        self._settled = 0  # spans taken off the queue and delivered or given up, in queue order
        self._lost_at_last_flush = self.dropped_spans - self.unattributed_spans
        self._warned = False
        self._shutdown = False
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, name="agentlightning-span-exporter", daemon=True)
        self._worker.start()

    # -- agent thread ---------------------------------------------------------------------------------------------
    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        """Stamp the current rollout/attempt ids unless the span already names a rollout."""
        context = _current.get()
        if context is None or self._shutdown:
            return
        attributes = span.attributes
        if attributes is not None and (semconv.ROLLOUT_ID in attributes or semconv.ATTEMPT_ID in attributes):
            return  # set explicitly by an integration that hopped threads; never mix it with ambient ids
        span.set_attributes({semconv.ROLLOUT_ID: context.rollout_id, semconv.ATTEMPT_ID: context.attempt_id})

    def on_end(self, span: ReadableSpan) -> None:
        """Enqueue a finished span for export; never blocks (drops and counts when the queue is full)."""
        if self._shutdown:
            return
        attributes = span.attributes
        if not (attributes and semconv.ROLLOUT_ID in attributes and semconv.ATTEMPT_ID in attributes):
            merged = {**span.resource.attributes, **(attributes or {})}
            if semconv.ROLLOUT_ID not in merged or semconv.ATTEMPT_ID not in merged:
                with self._lock:
                    self.unattributed_spans += 1
                    self.dropped_spans += 1
                return
        with self._lock:
            if len(self._queue) >= self._max_queue_size:
                self.dropped_spans += 1
                full = True
            else:
                self._queue.append(span)
                self._enqueued += 1
                full = False
                if len(self._queue) == self._max_batch_size:
                    self._wakeup.set()
        if full:
            self._warn_once(
                f"span queue is full ({self._max_queue_size} spans): the sink is slower than the agent or stuck"
            )

    # -- control ----------------------------------------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every span enqueued before the call is exported or given up on.

        True when that happened within ``timeout_s`` and no span was lost (queue full or export failure) since the
        previous flush; False otherwise.
        """
        with self._lock:
            target = self._enqueued
        self._wakeup.set()
        with self._progress:
            done = self._progress.wait_for(lambda: self._settled >= target, timeout=max(timeout_s, 0.0))
        with self._lock:
            lost = self.dropped_spans - self.unattributed_spans
            clean = lost == self._lost_at_last_flush
            self._lost_at_last_flush = lost
        return done and clean

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """OpenTelemetry's flush hook; see :meth:`flush`."""
        return self.flush(timeout_millis / 1000)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued (up to ``timeout_s``), stop the exporter thread, then ignore further spans."""
        if self._shutdown:
            return
        self._shutdown = True
        _live_processors.discard(self)
        self._stop.set()
        self._wakeup.set()
        self._worker.join(timeout_s)
        if self._worker.is_alive():
            with self._lock:
                abandoned = len(self._queue)
                self._queue.clear()
                self.dropped_spans += abandoned
            with self._progress:  # abandoned spans are settled, so a later flush does not wait for them
                self._settled += abandoned
                self._progress.notify_all()
            if abandoned:
                self._warn_once(f"shutdown gave up on {abandoned} spans after {timeout_s}s: the sink is stuck")

    # -- exporter thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wakeup.wait(self._export_interval_s)
            self._wakeup.clear()
            self._drain_safely()
            if self._stop.is_set():
                self._drain_safely()
                close = getattr(self._sink, "close", None)
                if callable(close):
                    try:
                        close()
                    except Exception:  # closing must not mask the shutdown of the agent's process
                        logger.exception("agentlightning: closing the span sink failed")
                return

    def _drain_safely(self) -> None:
        try:
            self._drain()
        except Exception:  # a bug here must not kill the exporter thread and stall every later flush
            logger.exception("agentlightning: span export loop failed; continuing")

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                count = min(len(self._queue), self._max_batch_size)
                batch = [self._queue.popleft() for _ in range(count)]
            delivered = self._deliver(self._convert(batch))
            with self._progress:
                self._settled += count
                self.exported_spans += delivered
                self._progress.notify_all()
            if delivered < count:
                with self._lock:
                    self.dropped_spans += count - delivered

    def _convert(self, batch: list[ReadableSpan]) -> list[Span]:
        spans: list[Span] = []
        for readable in batch:
            try:
                spans.append(span_from_readable(readable))
            except Exception as exc:  # a malformed span must not stop the others
                self._warn_once(f"span {readable.name!r} could not be converted: {exc}")
        return spans

    def _deliver(self, spans: list[Span]) -> int:
        """Export with bounded retries; returns how many spans reached the sink."""
        if not spans:
            return 0
        for attempt in range(self._max_export_retries + 1):
            try:
                self._sink.export(spans)
                return len(spans)
            except ValueError as exc:
                # The store rejected the batch's content (e.g. an unknown attempt): retrying cannot help, but the
                # other spans of the batch are still good, so save them one by one.
                if len(spans) == 1:
                    self._record_failure(f"the sink rejected a span: {exc}")
                    return 0
                return sum(self._deliver([span]) for span in spans)
            except Exception as exc:
                if attempt == self._max_export_retries:
                    self._record_failure(
                        f"export of {len(spans)} spans failed {attempt + 1} times, "
                        f"last with {type(exc).__name__}: {exc}"
                    )
                    return 0
                self._stop.wait(self._retry_backoff_s * 2**attempt)
        return 0

    def _record_failure(self, reason: str) -> None:
        with self._progress:
            self.failed_exports += 1
        self._warn_once(reason)

    def _warn_once(self, reason: str) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        logger.warning(
            "agentlightning tracing is dropping spans: %s. Further drops are counted in LightningTracer.dropped_spans "
            "without another warning.",
            reason,
        )

    def _after_fork(self) -> None:
        # The exporter thread does not survive fork(); the child starts its own with an empty queue.
        if not self._shutdown:
            self._lock = threading.Lock()
            self._progress = threading.Condition()
            self._start_worker()


_live_processors: weakref.WeakSet[LightningSpanProcessor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for processor in list(_live_processors):
        processor._after_fork()  # pyright: ignore[reportPrivateUsage]  # module-internal fork hook


def _shutdown_at_exit() -> None:
    for processor in list(_live_processors):
        processor.shutdown(timeout_s=2.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_at_exit)


# --- tracer -------------------------------------------------------------------------------------------------------
class LightningTracer:
    """Records spans of rollouts with OpenTelemetry and delivers them to a sink off the agent's thread.

    With ``provider=None`` it creates its own TracerProvider (not installed as OpenTelemetry's global one): a
    :class:`~agentlightning._lean_tracer.LeanTracerProvider`, or the SDK's when the environment configures SDK-only
    behaviour (another ``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED=true``). With a user's SDK
    provider it adds its processor to it, leaving the user's other processors untouched.
    """

    def __init__(
        self,
        sink: SpanSink,
        *,
        provider: TracerProvider | None = None,
        max_queue_size: int = 8192,
        max_batch_size: int = 512,
        export_interval_s: float = 0.5,
        max_export_retries: int = 3,
        retry_backoff_s: float = 0.1,
    ) -> None:
        self.processor = LightningSpanProcessor(
            sink,
            max_queue_size=max_queue_size,
            max_batch_size=max_batch_size,
            export_interval_s=export_interval_s,
            max_export_retries=max_export_retries,
            retry_backoff_s=retry_backoff_s,
        )
        self._owns_provider = provider is None
        self.provider: TracerProvider | LeanTracerProvider
        if provider is not None:
            self.provider = provider
        else:
            resource = Resource.create({"service.name": "agentlightning"})
            sdk_only = sdk_settings_in_environment()
            if sdk_only:
                logger.debug("agentlightning: %s set, recording spans with the OpenTelemetry SDK", ", ".join(sdk_only))
            self.provider = TracerProvider(resource=resource) if sdk_only else LeanTracerProvider(resource)
        self.provider.add_span_processor(self.processor)
        self._tracers: dict[str, trace_api.Tracer] = {}

    def get_tracer(self, name: str = "agentlightning") -> trace_api.Tracer:
        """An OpenTelemetry tracer whose spans go through this pipeline."""
        tracer = self._tracers.get(name)
        if tracer is None:
            tracer = self._tracers.setdefault(name, self.provider.get_tracer(name))
        return tracer

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Deliver every span finished so far; True when all arrived within ``timeout_s`` with none lost."""
        return self.processor.flush(timeout_s)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued, stop the exporter thread, and shut down the provider if it is ours."""
        self.processor.shutdown(timeout_s)
        if self._owns_provider:
            self.provider.shutdown()

    @property
    def dropped_spans(self) -> int:
        """Spans that were not delivered: queue full, export failed, unattributed, or abandoned at shutdown."""
        return self.processor.dropped_spans

    @property
    def unattributed_spans(self) -> int:
        """Spans dropped because they ended with no rollout/attempt id (also counted in dropped_spans)."""
        return self.processor.unattributed_spans

    @property
    def exported_spans(self) -> int:
        """Spans the sink accepted."""
        return self.processor.exported_spans

    @property
    def failed_exports(self) -> int:
        """Batches (or single spans) given up on after the sink raised."""
        return self.processor.failed_exports


# --- process-global tracer -------------------------------------------------------------------------------------------
_global_lock = threading.Lock()
_global_tracer: LightningTracer | None = None
_nowhere_provider: TracerProvider | None = None


def init_tracing(sink: SpanSink, provider: TracerProvider | None = None) -> LightningTracer:
    """Create the process-wide tracer used by emit helpers and integrations; shuts down any previous one."""
    global _global_tracer
    tracer = LightningTracer(sink, provider=provider)
    with _global_lock:
        previous, _global_tracer = _global_tracer, tracer
    if previous is not None:
        previous.shutdown()
    return tracer


def get_lightning_tracer() -> LightningTracer | None:
    """The process-wide tracer set by :func:`init_tracing`, if any."""
    return _global_tracer


def get_tracer(name: str = "agentlightning") -> trace_api.Tracer:
    """A tracer of the process-wide pipeline; without :func:`init_tracing`, one whose spans work but go nowhere."""
    global _nowhere_provider
    tracer = _global_tracer
    if tracer is not None:
        return tracer.get_tracer(name)
    with _global_lock:
        if _nowhere_provider is None:
            _nowhere_provider = TracerProvider()
        return _nowhere_provider.get_tracer(name)


def shutdown_tracing(timeout_s: float = 5.0) -> None:
    """Flush and stop the process-wide tracer; later spans from :func:`get_tracer` go nowhere."""
    global _global_tracer
    with _global_lock:
        tracer, _global_tracer = _global_tracer, None
    if tracer is not None:
        tracer.shutdown(timeout_s)
