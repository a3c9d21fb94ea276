"""The span processor added to the TracerProvider AutoGen records into: it forwards AutoGen's spans and ours.

AutoGen 0.7 creates its spans with OpenTelemetry's global API (``trace.get_tracer("autogen-core")`` for agent and
tool spans; ``"autogen <runtime>"`` tracers for the agent runtime's messaging). This processor, added once to that
provider, is the bridge into Agent Lightning's pipeline:

- **Gate.** It forwards only while :func:`agentlightning_autogen.instrument` is in effect for its provider, and only
  spans of AutoGen's tracers and of this integration, to the span processor of the process-wide
  :class:`~agentlightning.tracing.LightningTracer` current when the span started (that processor stamps the rollout
  and attempt ids).
- **Noise.** Runtime messaging spans (``autogen publish/process/create/send/ack …``) and ``create_agent`` spans say
  nothing about what an agent did, and there are many; they are dropped unless ``keep_runtime_spans``. A kept span
  whose parent was dropped is re-parented to its nearest kept ancestor, so every stored parent exists.
- **Agents.** It remembers the agent name of every open kept span (its own ``gen_ai.agent.name`` or its parent's), so
  the model-client wrapper can name the agent of an LLM call from the current span without walking OTel contexts.
- **Same provider.** A Lightning tracer built on this provider (``init_tracing(sink, provider=...)``) gets every
  span directly; then nothing is forwarded (no duplicates), so runtime spans are stored and tool results are not.
- **Tool results.** AutoGen ends its tool span inside ``BaseTool.run_json``, before the result reaches our wrapper;
  the span of a wrapped call is held back at its end and released by the wrapper with arguments and result added.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import Event, ReadableSpan, Span as SdkSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import Span, SpanContext, Tracer
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv, tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context

logger = logging.getLogger("agentlightning_autogen")

TRACER_NAME = "agentlightning_autogen"
_AUTOGEN_GENAI_SCOPE = "autogen-core"
_AUTOGEN_RUNTIME_SCOPE_PREFIX = "autogen "  # TraceHelper names its tracers f"autogen {runtime name}"
_CREATE_AGENT = "create_agent"
# Dropped spans are remembered after they end: AutoGen's runtime starts a "process" span under a "publish" span
# that has already ended. Bounded, oldest first out; 16k entries cover thousands of concurrent team turns.
_MAX_DROPPED = 16384


@dataclass(frozen=True, slots=True)
class InstrumentState:
    """What :func:`instrument` set up: the provider AutoGen records into and the switches."""

    provider: TracerProvider
    tracer: Tracer
    processor: AutogenSpanProcessor
    keep_runtime_spans: bool


_state: InstrumentState | None = None


def active_state() -> InstrumentState | None:
    """The current instrumentation, or None when uninstrumented."""
    return _state


def set_state(state: InstrumentState | None) -> None:
    """Install or clear the instrumentation (called by instrument/uninstrument under their lock)."""
    global _state
    _state = state


_failures = 0


def report_failure(where: str, error: BaseException) -> None:
    """Log a failure inside the integration: once as a warning, then at debug level (the agent run continues)."""
    global _failures
    _failures += 1
    if _failures == 1:
        logger.warning(
            "agentlightning_autogen: %s failed; the run continues but its spans may be incomplete "
            "(further failures are logged at debug level)",
            where,
            exc_info=error,
        )
    else:
        logger.debug("agentlightning_autogen: %s failed (%d failures so far)", where, _failures, exc_info=error)


@dataclass(slots=True)
class ToolCall:
    """One wrapped ``run_json`` call: its arguments and result, and the AutoGen tool span held back until both."""

    arguments: str
    result: str | None = None
    span_id: int | None = None
    held: tuple[SpanProcessor, ReadableSpan] | None = None
    released: bool = False

    def release(self) -> None:
        """Deliver the held tool span with the result added (called by the wrapper once run_json returned)."""
        self.released = True
        held, self.held = self.held, None
        if held is None:
            return
        target, span = held
        if self.result is not None:
            span = copy_span(span, span.parent, {semconv.GEN_AI_TOOL_CALL_RESULT: self.result})
        target.on_end(span)


#: The run_json call in progress in this task (read by the processor when AutoGen starts the tool's span).
pending_tool: ContextVar[ToolCall | None] = ContextVar("agentlightning_autogen_tool", default=None)


def one_event_per_exception(events: Sequence[Event]) -> list[Event]:
    """``events`` with repeated ``exception`` events of the same exception (type and message) dropped.

    AutoGen's tool span records a failing tool's exception itself and then again as it leaves the span's context
    manager (``record_exception=True``), so each failure arrived as two events (their stack traces differ in depth).
    """
    seen: set[tuple[object, ...]] = set()
    kept: list[Event] = []
    for event in events:
        if event.name == "exception":
            attributes = event.attributes or {}
            key = (attributes.get("exception.type"), attributes.get("exception.message"))
            if key in seen:
                continue
            seen.add(key)
        kept.append(event)
    return kept


def copy_span(
    span: ReadableSpan, parent: SpanContext | None, extra: dict[str, AttributeValue] | None = None
) -> ReadableSpan:
    """A finished span with another parent and/or more attributes (a span's own fields are fixed once it ended),
    one event per exception."""
    attributes = dict(span.attributes or {})
    if extra:
        attributes.update(extra)
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=parent,
        resource=span.resource,
        attributes=attributes,
        events=one_event_per_exception(span.events),
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


@dataclass(slots=True)
class _Forwarded:
    """A kept span on its way through: where it goes, and its parent if a dropped span was in between."""

    target: SpanProcessor
    parent: SpanContext | None
    reparented: bool
    tool: ToolCall | None = None


@dataclass(slots=True)
class _Book:
    forwarded: dict[int, _Forwarded] = field(default_factory=lambda: {})
    agents: dict[int, str] = field(default_factory=lambda: {})
    dropped: OrderedDict[int, SpanContext | None] = field(default_factory=lambda: OrderedDict())


class AutogenSpanProcessor(SpanProcessor):
    """Forwards AutoGen's spans and this integration's to Agent Lightning's pipeline (see the module docstring)."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._lock = threading.Lock()
        self._book = _Book()

    def _state(self) -> InstrumentState | None:
        state = _state
        return state if state is not None and state.provider is self._provider else None

    # --- SpanProcessor ----------------------------------------------------------------------------------------------
    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        """Decide whether the span is kept; stamp and forward kept spans, remember dropped ones for re-parenting."""
        try:
            self._on_start(span, parent_context)
        except Exception as error:
            report_failure("span start", error)

    def on_end(self, span: ReadableSpan) -> None:
        """Forward a kept span (re-parented if needed; a wrapped tool's span waits for its result)."""
        try:
            self._on_end(span)
        except Exception as error:
            report_failure("span end", error)

    def shutdown(self) -> None:
        """Nothing to release: delivery belongs to the Lightning tracer's processor."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the process-wide Lightning tracer."""
        tracer = tracing.get_lightning_tracer()
        return True if tracer is None else tracer.flush(timeout_millis / 1000)

    # --- internals --------------------------------------------------------------------------------------------------
    def _on_start(self, span: SdkSpan, parent_context: Context | None) -> None:
        state = self._state()
        if state is None:
            return
        scope = span.instrumentation_scope.name if span.instrumentation_scope is not None else ""
        ours = scope == TRACER_NAME
        runtime = scope.startswith(_AUTOGEN_RUNTIME_SCOPE_PREFIX)
        if not (ours or runtime or scope == _AUTOGEN_GENAI_SCOPE):
            return  # another library's span on the user's provider: not ours to store
        attributes = span.attributes or {}
        context = span.get_span_context()
        parent = span.parent
        book = self._book
        with self._lock:
            reparented = parent is not None and parent.span_id in book.dropped
            if reparented and parent is not None:
                parent = book.dropped[parent.span_id]
            noise = runtime or attributes.get(semconv.GEN_AI_OPERATION_NAME) == _CREATE_AGENT
            if noise and not state.keep_runtime_spans:
                book.dropped[context.span_id] = parent
                if len(book.dropped) > _MAX_DROPPED:
                    book.dropped.popitem(last=False)
                return
            agent = attributes.get(semconv.GEN_AI_AGENT_NAME)
            inherited = not isinstance(agent, str) and parent is not None
            if inherited and parent is not None:
                agent = book.agents.get(parent.span_id)
            if isinstance(agent, str):
                book.agents[context.span_id] = agent
        lightning = tracing.get_lightning_tracer()
        if lightning is None:
            return
        tool: ToolCall | None = None
        if not ours:
            span.set_attribute(semconv.SPAN_SOURCE, semconv.SOURCE_HOOK)
            if inherited and isinstance(agent, str):
                span.set_attribute(semconv.GEN_AI_AGENT_NAME, agent)  # AutoGen's tool spans name no agent
            if attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_EXECUTE_TOOL:
                tool = pending_tool.get()
                if tool is not None and tool.span_id is None:
                    tool.span_id = context.span_id
                    span.set_attribute(semconv.GEN_AI_TOOL_CALL_ARGUMENTS, tool.arguments)
                else:
                    tool = None
        if lightning.provider is self._provider:
            # The Lightning tracer was built on this very provider, so its processor already gets every span
            # directly: forwarding would store each span twice. (Nothing can be filtered or held back then.)
            return
        target = lightning.processor
        target.on_start(span, parent_context)
        with self._lock:
            book.forwarded[context.span_id] = _Forwarded(target, parent, reparented, tool)

    def _on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if context is None:
            return
        with self._lock:
            forwarded = self._book.forwarded.pop(context.span_id, None)
            self._book.agents.pop(context.span_id, None)
        if forwarded is None:
            return
        if forwarded.reparented:
            span = copy_span(span, forwarded.parent)
        elif sum(event.name == "exception" for event in span.events) > 1:
            span = copy_span(span, span.parent)
        tool = forwarded.tool
        if tool is not None and not tool.released:
            tool.held = (forwarded.target, span)
            return
        forwarded.target.on_end(span)

    def locate(self, span: Span) -> tuple[SpanContext | None, str | None]:
        """The parent to give a span started under ``span`` (skipping dropped spans), and its agent's name."""
        context = span.get_span_context()
        if not context.is_valid:
            return None, None
        with self._lock:
            parent: SpanContext | None = context
            if context.span_id in self._book.dropped:
                parent = self._book.dropped[context.span_id]
            agent = self._book.agents.get(parent.span_id) if parent is not None else None
        return parent, agent

    @property
    def open_spans(self) -> int:
        """Kept spans started and not yet ended (a leak check for tests)."""
        with self._lock:
            return len(self._book.forwarded)
