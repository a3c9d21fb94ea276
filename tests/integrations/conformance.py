"""Integration conformance invariants: one suite every framework integration must pass.

The invariants (STYLE.md habit 9): every span names the rollout and attempt it ran in, with well-formed trace and
span ids; within each trace the parents exist and form one tree; every LLM span names its agent; a user's exception
is recorded on a span (status ERROR plus an ``exception`` event) and reaches the caller unchanged; neither a store
that is down nor a failure inside the integration's own hook breaks the agent; instrumenting twice records once;
after uninstrumenting no hook is left; concurrent rollouts (threads and asyncio tasks) never share a trace or a
parent.

This module imports only core, pytest and the standard library: the CrewAI suite runs it in a virtual environment
that has nothing else.

How an integration plugs in (see ``tests/integrations/langchain/test_conformance.py`` for a complete example):

1. Write an :class:`IntegrationHarness` for the framework:

   - :meth:`~IntegrationHarness.run` / :meth:`~IntegrationHarness.arun`: run the framework once (a small agent with
     a fake model and at least one tool, so that LLM and tool spans appear), sync and async. The run must be
     deterministic (same spans every time) and safe to call from several threads or tasks at once: build a fresh
     agent and fake model per call. It relies on :meth:`~IntegrationHarness.instrument` having been called; it must
     not attach the integration itself. With ``fail_with``, the user's code inside the run (a tool) raises that
     exception.
   - :meth:`~IntegrationHarness.instrument` / :meth:`~IntegrationHarness.uninstrument`: the integration's public
     zero-line functions (or the closest thing the framework allows).
   - :meth:`~IntegrationHarness.attached_hooks`: how many of the integration's hooks a new run would get right now
     (called inside a rollout context, so gated hooks count).
   - :meth:`~IntegrationHarness.broken_hook`: a context manager inside which the integration's hook internals fail
     (for example its tracer raises); the fault a user can never cause, hence a patch.
   - Optionally :meth:`~IntegrationHarness.flush` (frameworks that deliver events on their own threads) and
     :meth:`~IntegrationHarness.user_error` (frameworks that wrap user exceptions).

2. Subclass :class:`IntegrationConformance` in a module named ``test_*.py`` with a class named ``Test*`` and
   implement :meth:`~IntegrationConformance.make_harness`. pytest collects every ``test_*`` method of the base.
   Adjust :attr:`~IntegrationConformance.span_sources` (values of ``agentlightning.span.source`` your spans may
   carry) or :attr:`~IntegrationConformance.traces_per_run` (default 1: one run is one tree) only when the
   framework forces it, and say why in a comment.

Spans are captured through the process-wide pipeline (``init_tracing`` with a list sink), so the integration must
create its spans with ``agentlightning.tracing.get_tracer()``. ``run`` is never called on an event loop's thread.

The helpers :func:`assert_ids`, :func:`assert_span_tree` and :func:`assert_isolated` are public for integration
specific tests too.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import uuid
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import pytest
from opentelemetry.trace import NoOpTracer, Span as OtelSpan

from agentlightning import semconv, tracing
from agentlightning.tracing import (
    LightningTracer,
    ListSpanSink,
    init_tracing,
    rollout_context,
    shutdown_tracing,
)
from agentlightning.types.spans import Span

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")
_CONCURRENCY = 4


class ConformanceError(Exception):
    """The user exception the suite injects; unique per test so identity and message can be checked."""


class StoreDownSink:
    """A span sink whose store is unreachable: every export raises, as a dead store server would."""

    def __init__(self) -> None:
        self.attempts = 0

    def export(self, spans: Sequence[Span]) -> None:
        """Fail like a store that is down."""
        self.attempts += 1
        raise ConnectionError("store is down (conformance fault injection)")


class IntegrationHarness(ABC):
    """What an integration provides to the shared suite (see the module docstring)."""

    @abstractmethod
    def run(self, *, fail_with: BaseException | None = None) -> None:
        """Run the framework once, synchronously; with ``fail_with``, a tool of the user raises it."""

    @abstractmethod
    async def arun(self, *, fail_with: BaseException | None = None) -> None:
        """Run the framework once on the running event loop; with ``fail_with``, a tool of the user raises it."""

    @abstractmethod
    def instrument(self) -> None:
        """Call the integration's zero-line instrument function."""

    @abstractmethod
    def uninstrument(self) -> None:
        """Call the integration's uninstrument function."""

    @abstractmethod
    def attached_hooks(self) -> int:
        """How many of the integration's hooks a run started now would get (0 or 1 when correct)."""

    @abstractmethod
    def broken_hook(self) -> AbstractContextManager[None]:
        """Inside this context, the integration's own hook code fails on every event."""

    def flush(self) -> None:  # noqa: B027  # optional hook with nothing to do by default, not a missing abstract
        """Wait until the framework has delivered every event of finished runs to the hook (default: it has)."""

    def user_error(self, raised: BaseException) -> BaseException:
        """The user's exception inside what the framework raised (default: the framework raises it as is)."""
        return raised


# --- assertions, reusable by integration-specific tests -----------------------------------------------------------
def assert_ids(spans: Iterable[Span], rollout_id: str, attempt_id: str) -> None:
    """Every span names the given rollout and attempt and has well-formed OpenTelemetry ids."""
    for span in spans:
        assert span.rollout_id == rollout_id, f"span {span.name!r} names rollout {span.rollout_id}, not {rollout_id}"
        assert span.attempt_id == attempt_id, f"span {span.name!r} names attempt {span.attempt_id}, not {attempt_id}"
        assert _TRACE_ID.match(span.trace_id), f"span {span.name!r} has a malformed trace id {span.trace_id!r}"
        assert _SPAN_ID.match(span.span_id), f"span {span.name!r} has a malformed span id {span.span_id!r}"
        assert span.parent_id is None or _SPAN_ID.match(span.parent_id), f"span {span.name!r}: bad parent id"
        assert span.end_time is not None and span.end_time >= span.start_time, f"span {span.name!r} never ended"


def assert_span_tree(spans: Sequence[Span]) -> None:
    """Within each trace, span ids are unique, every parent exists, and the spans form one tree (one root); a span
    records each exception once."""
    by_trace: dict[str, dict[str, Span]] = defaultdict(dict)
    for span in spans:
        failures = [
            (e.attributes.get("exception.type"), e.attributes.get("exception.message"))
            for e in span.events
            if e.name == "exception"
        ]
        assert len(failures) == len(set(failures)), f"span {span.name!r} records an exception twice: {failures}"
        trace = by_trace[span.trace_id]
        assert span.span_id not in trace, f"span id {span.span_id} appears twice in trace {span.trace_id}"
        trace[span.span_id] = span
    for trace_id, trace in by_trace.items():
        roots = [span.name for span in trace.values() if span.parent_id is None]
        assert len(roots) == 1, f"trace {trace_id} has {len(roots)} roots, expected 1: {roots}"
        for span in trace.values():
            seen: set[str] = set()
            node = span
            while node.parent_id is not None:
                assert node.parent_id in trace, (
                    f"span {node.name!r} names parent {node.parent_id}, which is not in trace {trace_id}"
                )
                assert node.span_id not in seen, f"parent cycle through span {node.name!r}"
                seen.add(node.span_id)
                node = trace[node.parent_id]


def assert_isolated(spans: Sequence[Span]) -> dict[str, list[Span]]:
    """No trace mixes rollouts (so no parent crosses rollouts); returns the spans grouped by rollout."""
    rollout_of_trace: dict[str, str] = {}
    by_rollout: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        owner = rollout_of_trace.setdefault(span.trace_id, span.rollout_id)
        assert owner == span.rollout_id, (
            f"trace {span.trace_id} mixes rollouts {owner} and {span.rollout_id} (span {span.name!r}): "
            "concurrent runs were cross-linked"
        )
        by_rollout[span.rollout_id].append(span)
    assert_span_tree(spans)
    return dict(by_rollout)


def shape(spans: Iterable[Span]) -> list[tuple[str, str | None]]:
    """(name, parent name) pairs, sorted: the structure of a run, independent of ids and timing."""
    spans = list(spans)
    names = {span.span_id: span.name for span in spans}
    return sorted((span.name, None if span.parent_id is None else names.get(span.parent_id)) for span in spans)


# --- span capture and faults ---------------------------------------------------------------------------------------
class SpanCapture:
    """The process-wide tracing pipeline of one test, delivering to a list (or to a failing sink)."""

    def __init__(self, sink: ListSpanSink | StoreDownSink) -> None:
        self.sink = sink
        self.tracer: LightningTracer = init_tracing(sink)

    def spans(self, rollout_id: str | None = None) -> list[Span]:
        """Every span delivered so far (of one rollout if given), after flushing the pipeline."""
        self.tracer.flush(timeout_s=10.0)
        if not isinstance(self.sink, ListSpanSink):
            return []
        return [span for span in self.sink.spans if rollout_id is None or span.rollout_id == rollout_id]


@contextlib.contextmanager
def captured_spans() -> Iterator[SpanCapture]:
    """The process-wide tracing pipeline delivering to a list for the duration of the block, shut down after it."""
    capture = SpanCapture(ListSpanSink())
    try:
        yield capture
    finally:
        shutdown_tracing()


class _BrokenTracer(NoOpTracer):
    """A tracer whose every span start fails: the fault inside a hook that a user can never cause."""

    def start_span(self, *args: Any, **kwargs: Any) -> OtelSpan:
        raise RuntimeError("tracer broken (conformance fault injection)")


@contextlib.contextmanager
def broken_tracer() -> Iterator[None]:
    """Inside this block every span start of a tracer from ``agentlightning.tracing.get_tracer`` fails.

    For a :meth:`IntegrationHarness.broken_hook` whose hook resolves the process tracer when it starts spans.
    """
    original = tracing.get_tracer
    tracing.get_tracer = lambda name="agentlightning": _BrokenTracer()
    try:
        yield
    finally:
        tracing.get_tracer = original


def _new_ids() -> tuple[str, str]:
    return f"ro-{uuid.uuid4().hex}", f"at-{uuid.uuid4().hex}"


def _has_exception_event(span: Span, error: BaseException) -> bool:
    for event in span.events:
        if event.name != "exception":
            continue
        kind = str(event.attributes.get("exception.type", ""))
        message = str(event.attributes.get("exception.message", ""))
        if kind.endswith(type(error).__name__) and str(error) in message:
            return True
    return False


class IntegrationConformance(ABC):
    """The shared invariants; subclass as ``Test<Framework>Conformance`` and implement :meth:`make_harness`."""

    #: Values of ``agentlightning.span.source`` the integration's spans may carry.
    span_sources: ClassVar[frozenset[str]] = frozenset({semconv.SOURCE_HOOK})
    #: Traces one run of the harness produces. One by default: a run is one tree, so that a span whose parent was
    #: lost (e.g. taken from an ambient context on another thread) shows up as an extra trace.
    traces_per_run: ClassVar[int] = 1

    @abstractmethod
    def make_harness(self) -> IntegrationHarness:
        """A fresh harness for one test."""

    # --- fixtures (``capture``, spans delivered to a list, comes from tests/integrations/conftest.py) ---------------
    @pytest.fixture
    def harness(self, capture: SpanCapture) -> Iterator[IntegrationHarness]:
        """The integration, instrumented for the test and uninstrumented after it."""
        harness = self.make_harness()
        harness.instrument()
        try:
            yield harness
        finally:
            harness.uninstrument()

    def _run_in_rollout(self, harness: IntegrationHarness, capture: SpanCapture) -> tuple[str, list[Span]]:
        rollout_id, attempt_id = _new_ids()
        with rollout_context(rollout_id, attempt_id):
            harness.run()
        harness.flush()
        return rollout_id, capture.spans(rollout_id)

    # --- ids and structure --------------------------------------------------------------------------------------------
    def test_ids_on_every_span(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """Every span names its rollout and attempt, has valid ids and says which integration recorded it."""
        rollout_id, attempt_id = _new_ids()
        with rollout_context(rollout_id, attempt_id):
            harness.run()
        harness.flush()
        spans = capture.spans()
        assert spans, "the run recorded no spans"
        assert_ids(spans, rollout_id, attempt_id)
        for span in spans:
            source = span.attributes.get(semconv.SPAN_SOURCE)
            assert source in self.span_sources, f"span {span.name!r} has {semconv.SPAN_SOURCE}={source!r}"

    def test_parents_form_a_tree(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """One run is one tree: every parent exists in its trace, one root per trace, ``traces_per_run`` traces."""
        _, spans = self._run_in_rollout(harness, capture)
        assert_span_tree(spans)
        assert len(spans) > 1, "a run of an agent with a tool should record more than one span"
        traces = {span.trace_id for span in spans}
        assert len(traces) == self.traces_per_run, (
            f"one run recorded {len(traces)} traces, expected {self.traces_per_run}: spans lost their parents"
        )

    def test_llm_spans_name_their_agent(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """Every LLM span carries gen_ai.agent.name, so the adapter can select agents by name."""
        _, spans = self._run_in_rollout(harness, capture)
        llm = [span for span in spans if span.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_CHAT]
        assert llm, "the run recorded no LLM span (gen_ai.operation.name = chat)"
        for span in llm:
            assert span.attributes.get(semconv.GEN_AI_AGENT_NAME), f"LLM span {span.name!r} has no agent name"

    async def test_async_run_ids_and_tree(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """The async path records the same structure as the sync one, with the same invariants."""
        # The sync run goes to a worker thread: some frameworks refuse blocking runs inside an event loop.
        _, sync_spans = await asyncio.to_thread(self._run_in_rollout, harness, capture)
        rollout_id, attempt_id = _new_ids()
        with rollout_context(rollout_id, attempt_id):
            await harness.arun()
        harness.flush()
        spans = capture.spans(rollout_id)
        assert spans, "the async run recorded no spans"
        assert_ids(spans, rollout_id, attempt_id)
        assert_span_tree(spans)
        assert shape(spans) == shape(sync_spans)

    # --- errors -----------------------------------------------------------------------------------------------------
    def test_user_exception_recorded_and_reraised(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """A user's exception reaches the caller unchanged and is recorded (status ERROR + exception event)."""
        error = ConformanceError(f"tool failed {uuid.uuid4().hex}")
        rollout_id, attempt_id = _new_ids()
        with rollout_context(rollout_id, attempt_id), pytest.raises(BaseException) as raised:
            harness.run(fail_with=error)
        assert harness.user_error(raised.value) is error, f"the user's exception was replaced by {raised.value!r}"
        harness.flush()
        spans = capture.spans(rollout_id)
        assert_ids(spans, rollout_id, attempt_id)
        assert_span_tree(spans)
        failed = [span for span in spans if span.status.code == "ERROR" and _has_exception_event(span, error)]
        assert failed, "no span has status ERROR and an exception event for the user's exception"

    async def test_user_exception_recorded_and_reraised_async(
        self, harness: IntegrationHarness, capture: SpanCapture
    ) -> None:
        """The same on the async path."""
        error = ConformanceError(f"tool failed {uuid.uuid4().hex}")
        rollout_id, attempt_id = _new_ids()
        with rollout_context(rollout_id, attempt_id), pytest.raises(BaseException) as raised:
            await harness.arun(fail_with=error)
        assert harness.user_error(raised.value) is error, f"the user's exception was replaced by {raised.value!r}"
        harness.flush()
        spans = capture.spans(rollout_id)
        assert any(span.status.code == "ERROR" and _has_exception_event(span, error) for span in spans)

    def test_store_down_never_breaks_the_run(self, harness: IntegrationHarness) -> None:
        """With a sink that always fails, the agent still runs to completion (spans are dropped, counted)."""
        sink = StoreDownSink()
        down = SpanCapture(sink)
        try:
            rollout_id, attempt_id = _new_ids()
            with rollout_context(rollout_id, attempt_id):
                harness.run()
            harness.flush()
            assert down.tracer.flush(timeout_s=10.0) is False, "spans were lost, so flush must report it"
            assert sink.attempts > 0, "the pipeline never tried to deliver the run's spans"
            assert down.tracer.dropped_spans > 0
        finally:
            shutdown_tracing()

    def test_broken_hook_never_breaks_the_run(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """When the integration's own code fails, the run completes and the user's exceptions still pass unchanged."""
        rollout_id, attempt_id = _new_ids()
        error = ConformanceError(f"tool failed {uuid.uuid4().hex}")
        with harness.broken_hook(), rollout_context(rollout_id, attempt_id):
            harness.run()
            with pytest.raises(BaseException) as raised:
                harness.run(fail_with=error)
        assert harness.user_error(raised.value) is error

    # --- instrument / uninstrument ----------------------------------------------------------------------------------
    def test_instrument_twice_records_once(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """A second instrument() changes nothing: one hook, the same spans."""
        _, once = self._run_in_rollout(harness, capture)
        harness.instrument()
        with rollout_context(*_new_ids()):
            assert harness.attached_hooks() == 1
        _, twice = self._run_in_rollout(harness, capture)
        assert shape(twice) == shape(once)

    def test_uninstrument_leaves_no_hook(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """After uninstrument() no hook is attached and nothing is recorded; instrument() works again after it."""
        with rollout_context(*_new_ids()):
            assert harness.attached_hooks() == 1
        harness.uninstrument()
        harness.uninstrument()  # idempotent, as a second instrument() is
        with rollout_context(*_new_ids()):
            assert harness.attached_hooks() == 0
        _, spans = self._run_in_rollout(harness, capture)
        assert spans == [], f"spans recorded after uninstrument(): {[span.name for span in spans]}"
        harness.instrument()
        _, again = self._run_in_rollout(harness, capture)
        assert again, "instrument() after uninstrument() recorded nothing"

    # --- concurrency --------------------------------------------------------------------------------------------------
    def test_concurrent_threads_never_cross_link(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """Rollouts running at once on threads each get exactly the spans of one run, in their own traces."""
        _, single = self._run_in_rollout(harness, capture)
        ids = [_new_ids() for _ in range(_CONCURRENCY)]
        start = threading.Barrier(_CONCURRENCY)
        errors: list[BaseException] = []

        def one(rollout_id: str, attempt_id: str) -> None:
            try:
                start.wait(timeout=30)
                with rollout_context(rollout_id, attempt_id):
                    harness.run()
            except BaseException as error:  # reported on the test's thread below
                errors.append(error)

        threads = [threading.Thread(target=one, args=pair) for pair in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, f"concurrent runs failed: {errors!r}"
        harness.flush()
        self._assert_each_rollout_like(capture, ids, single)

    async def test_concurrent_tasks_never_cross_link(self, harness: IntegrationHarness, capture: SpanCapture) -> None:
        """Rollouts running at once as asyncio tasks each get exactly the spans of one run, in their own traces."""
        rollout_id, attempt_id = _new_ids()
        with rollout_context(rollout_id, attempt_id):
            await harness.arun()
        harness.flush()
        single = capture.spans(rollout_id)
        ids = [_new_ids() for _ in range(_CONCURRENCY)]

        async def one(rollout_id: str, attempt_id: str) -> None:
            with rollout_context(rollout_id, attempt_id):
                await harness.arun()

        await asyncio.gather(*(one(*pair) for pair in ids))
        harness.flush()
        self._assert_each_rollout_like(capture, ids, single)

    def _assert_each_rollout_like(
        self, capture: SpanCapture, ids: Sequence[tuple[str, str]], single: Sequence[Span]
    ) -> None:
        spans = [span for span in capture.spans() if span.rollout_id in {rollout for rollout, _ in ids}]
        by_rollout = assert_isolated(spans)
        for rollout_id, attempt_id in ids:
            mine = by_rollout.get(rollout_id, [])
            assert_ids(mine, rollout_id, attempt_id)
            assert shape(mine) == shape(single), f"rollout {rollout_id} does not look like a single run"
            assert len({span.trace_id for span in mine}) == self.traces_per_run, f"rollout {rollout_id}: traces"
