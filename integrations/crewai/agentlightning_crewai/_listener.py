"""The CrewAI event listener that records crews, tasks, agents, LLM calls and tool calls as OpenTelemetry spans.

Facts it is built on (crewai 1.15): the event bus runs sync handlers later, on a thread pool of up to 10 workers, in
a copy of the emitter's context; so handlers of one crew run concurrently and out of order (a child's start may be
handled before its parent's, an end before its start). Every event names its enclosing scope in
``parent_event_id`` and every end event names its start in ``started_event_id``. Hence:

- Span times come from the events' own timestamps, never from when a handler happens to run.
- Parents come from event ids, kept in one dict under a lock: a span is started only once its parent's span exists
  (until then the node waits), and an end that arrives first is kept until its start is handled.
- Scopes that are not spans (CrewAI runs each agent execution as an internal flow, reasoning, guardrails, memory
  and knowledge lookups) are recorded as aliases of their parent, so what happens inside them attaches to the
  nearest span.
- The rollout is captured once per trace, from ``current_rollout()`` in the root's handler (which runs in a copy of
  the context of the thread that kicked the crew off), and written explicitly on every span of that trace.
- :meth:`LightningEventListener.flush` waits for the bus's pending handlers and then closes what CrewAI never
  closed (for example the agent span of a task whose callback raised), so spans are complete when a rollout ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import crewai.events as crewai_events
from crewai.events import BaseEventListener
from crewai.events.base_events import BaseEvent
from crewai.events.event_bus import CrewAIEventsBus, crewai_event_bus
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv, tracing
from agentlightning.tracing import RolloutContext, current_rollout
from agentlightning_crewai._attributes import (
    llm_end_attributes,
    llm_start_attributes,
    short,
    time_ns,
    tool_call_ids,
    tool_result,
    tool_start_attributes,
)

logger = logging.getLogger("agentlightning_crewai")

_TRACER_NAME: Final = "agentlightning_crewai"
# The agent name of an LLM call that no agent made (e.g. ``LLM.call`` outside any crew): the contract wants one.
_NO_AGENT: Final = "crewai"
# A finished trace whose late events never came is closed and forgotten after this long even without flush().
_STALE_S: Final = 60.0
# How often a new root may sweep finished traces when nobody calls flush().
_SWEEP_EVERY_S: Final = 10.0
# A scope at the root that is not a span (a user's Flow around crews) is forgotten after this long.
_ROOT_ALIAS_TTL_S: Final = 3600.0
# Native tool calls remembered per agent role until their tool starts (see LightningEventListener._pending_calls).
_MAX_PENDING_CALLS: Final = 64

_CREW, _TASK, _AGENT, _LLM, _TOOL, _ALIAS = "crew", "task", "agent", "llm", "tool", "alias"

# Scopes CrewAI opens around the things we record without being spans themselves (SCOPE_STARTING_EVENTS of
# crewai.events.event_context); resolved by name so a class missing from a release is skipped, not fatal.
_ALIAS_EVENTS: Final = (
    "FlowStartedEvent",
    "MethodExecutionStartedEvent",
    "AgentReasoningStartedEvent",
    "AgentEvaluationStartedEvent",
    "LLMGuardrailStartedEvent",
    "MemoryRetrievalStartedEvent",
    "MemorySaveStartedEvent",
    "MemoryQueryStartedEvent",
    "KnowledgeQueryStartedEvent",
    "MCPConnectionStartedEvent",
    "MCPToolExecutionStartedEvent",
    "CrewTrainStartedEvent",
    "CrewTestStartedEvent",
)


@dataclass(slots=True)
class _Trace:
    """What every span of one trace shares, fixed when its root started (``tracer`` None: outside any rollout)."""

    tracer: Tracer | None
    stamp: Mapping[str, AttributeValue]
    root: _Node
    ended_at: float | None = None  # monotonic time the root ended


@dataclass(slots=True)
class _End:
    """An end event waiting for (or applied to) its span."""

    time_ns: int
    attributes: dict[str, AttributeValue]
    error: BaseException | str | None = None
    error_type: str | None = None
    received: float = field(default_factory=time.monotonic)


@dataclass(slots=True, eq=False)
class _Node:
    """A CrewAI scope: a span once its parent is resolved, or an alias standing for its parent."""

    event_id: str
    kind: str
    parent_event_id: str | None
    rollout: RolloutContext | None
    name: str = ""
    start_ns: int = 0
    attributes: dict[str, AttributeValue] = field(default_factory=dict[str, AttributeValue])
    agent: str | None = None
    resolved: bool = False  # its parent is known: it has a span, or is an alias/unrecorded node of a trace
    span: Span | None = None  # its span; for an alias, its parent's
    trace: _Trace | None = None  # None once resolved: an alias at the root (e.g. a user's Flow)
    end: _End | None = None
    ended: bool = False
    created: float = field(default_factory=time.monotonic)
    call_id: str | None = None  # LLM calls: CrewAI's call id, which keys their end events


_KIND_OF_END: Final = {
    "crew_kickoff_completed": _CREW,
    "crew_kickoff_failed": _CREW,
    "task_completed": _TASK,
    "task_failed": _TASK,
    "agent_execution_completed": _AGENT,
    "agent_execution_error": _AGENT,
    "lite_agent_execution_completed": _AGENT,
    "lite_agent_execution_error": _AGENT,
    "tool_usage_finished": _TOOL,
    "tool_usage_error": _TOOL,
}


class LightningEventListener(BaseEventListener):
    """Records CrewAI runs inside rollouts as Agent Lightning spans: crew → task → agent → LLM call / tool call.

    Creating it registers its handlers on CrewAI's event bus (as every ``BaseEventListener`` does); :meth:`remove`
    unregisters every one of them. Use :func:`agentlightning_crewai.instrument` rather than creating it directly.
    """

    def __init__(self, *, tracer: Tracer | None = None) -> None:
        """Create the listener and register its handlers; ``tracer`` defaults to the process's Agent Lightning one."""
        self._tracer = tracer
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._waiting: dict[str, list[_Node]] = {}  # missing parent event id -> nodes waiting for it
        self._llm_by_call: dict[str, _Node] = {}
        self._early_ends: dict[str, _End] = {}  # start event id or LLM call id -> end handled before its start
        # Native tool calls an agent's LLM answered with and whose tool has not started yet: (tool name, call id).
        # CrewAI's ToolUsageStartedEvent carries no call id; the agent runs its calls in the order the model gave
        # them, so each tool start takes the first pending call of its name. Bounded: a call CrewAI never runs
        # (a cached result, a stopped agent) must not pile up.
        self._pending_calls: dict[str, deque[tuple[str, str]]] = {}
        # Crew kickoffs by the crew object that emits both events: after a failure CrewAI's scope stack can be off
        # and crew_kickoff_failed then names another scope's start (seen on crewai 1.15.30).
        self._crews: dict[int, _Node] = {}
        self._last_sweep = time.monotonic()
        self._traces: list[_Trace] = []
        self._registered: list[tuple[type[BaseEvent], Callable[[Any, Any], None]]] = []
        self._failures = 0
        super().__init__()

    # --- registration ---------------------------------------------------------------------------------------------
    def setup_listeners(self, crewai_event_bus: CrewAIEventsBus) -> None:
        """Register one handler per event class (the bus dispatches on the exact class, not on subclasses)."""
        events = crewai_events
        table: list[tuple[str, Callable[[Any, Any], None]]] = [
            ("CrewKickoffStartedEvent", self._on_crew_started),
            ("CrewKickoffCompletedEvent", self._on_end),
            ("CrewKickoffFailedEvent", self._on_end),
            ("TaskStartedEvent", self._on_task_started),
            ("TaskCompletedEvent", self._on_end),
            ("TaskFailedEvent", self._on_end),
            ("AgentExecutionStartedEvent", self._on_agent_started),
            ("AgentExecutionCompletedEvent", self._on_end),
            ("AgentExecutionErrorEvent", self._on_end),
            ("LiteAgentExecutionStartedEvent", self._on_lite_agent_started),
            ("LiteAgentExecutionCompletedEvent", self._on_end),
            ("LiteAgentExecutionErrorEvent", self._on_end),
            ("LLMCallStartedEvent", self._on_llm_started),
            ("LLMCallCompletedEvent", self._on_llm_end),
            ("LLMCallFailedEvent", self._on_llm_end),
            ("ToolUsageStartedEvent", self._on_tool_started),
            ("ToolUsageFinishedEvent", self._on_end),
            ("ToolUsageErrorEvent", self._on_end),
            *((name, self._on_alias) for name in _ALIAS_EVENTS),
        ]
        for name, method in table:
            event_class: type[BaseEvent] | None = getattr(events, name, None)
            if event_class is None:
                continue
            handler = self._guarded(method)
            crewai_event_bus.on(event_class)(handler)
            self._registered.append((event_class, handler))

    def remove(self) -> None:
        """Unregister every handler this listener registered (``off`` each); a second call does nothing."""
        registered, self._registered = self._registered, []
        for event_class, handler in registered:
            crewai_event_bus.off(event_class, handler)

    @property
    def handler_count(self) -> int:
        """How many handlers this listener has on the bus now (0 after :meth:`remove`)."""
        return len(self._registered)

    def _guarded(self, method: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        """The boundary: nothing our handlers do may raise into CrewAI (its bus would print it on the console)."""

        def handler(source: Any, event: Any) -> None:
            try:
                method(source, event)
            except Exception as error:
                self._failed(type(event).__name__, error)

        return handler

    def _failed(self, where: str, error: Exception) -> None:
        self._failures += 1
        if self._failures == 1:
            logger.warning(
                "agentlightning_crewai: handling %s failed; the crew continues but its spans may be incomplete "
                "(further failures are logged at debug level)",
                where,
                exc_info=error,
            )
        else:
            logger.debug("agentlightning_crewai: handling %s failed (%d so far)", where, self._failures, exc_info=error)

    # --- start handlers -------------------------------------------------------------------------------------------
    def _new_node(self, event: BaseEvent, kind: str, name: str, attributes: dict[str, AttributeValue]) -> _Node:
        return _Node(
            event.event_id,
            kind,
            event.parent_event_id,
            current_rollout(),  # the emitter's, as the bus runs handlers in a copy of its context
            name,
            time_ns(event.timestamp),
            attributes,
        )

    def _on_crew_started(self, source: Any, event: Any) -> None:
        crew = event.crew_name or getattr(source, "name", None) or "crew"
        node = self._new_node(event, _CREW, f"crew {short(str(crew))}", {"crewai.crew.name": str(crew)})
        with self._lock:
            node.end = self._early_ends.pop(_crew_key(source), None)
            if node.end is None:
                self._crews[id(source)] = node
        self._add(node)

    def _on_task_started(self, source: Any, event: Any) -> None:
        task = event.task_name or "task"
        node = self._new_node(event, _TASK, f"task {short(task)}", {"crewai.task.name": task})
        self._add(node)

    def _on_agent_started(self, source: Any, event: Any) -> None:
        self._add_agent(event, str(event.agent.role), str(event.agent.id))

    def _on_lite_agent_started(self, source: Any, event: Any) -> None:
        info: Mapping[str, Any] = event.agent_info or {}
        self._add_agent(event, str(info.get("role") or _NO_AGENT), info.get("id"))

    def _add_agent(self, event: BaseEvent, role: str, agent_id: Any) -> None:
        attributes: dict[str, AttributeValue] = {semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT}
        if agent_id is not None:
            attributes[semconv.GEN_AI_AGENT_ID] = str(agent_id)
        node = self._new_node(event, _AGENT, f"{semconv.OP_INVOKE_AGENT} {role}", attributes)
        node.agent = role
        self._add(node)

    def _on_llm_started(self, source: Any, event: Any) -> None:
        attributes = llm_start_attributes(event, source)
        node = self._new_node(event, _LLM, f"{semconv.OP_CHAT} {event.model or 'llm'}", attributes)
        node.agent, node.call_id = event.agent_role, event.call_id
        with self._lock:
            self._llm_by_call[event.call_id] = node
            early = self._early_ends.pop(event.call_id, None)
            if early is not None:
                self._early_ends.pop(event.event_id, None)
                node.end = early
        self._add(node)

    def _on_tool_started(self, source: Any, event: Any) -> None:
        attributes = tool_start_attributes(event)
        with self._lock:
            pending = self._pending_calls.get(str(event.agent_role))
            for i, (name, call_id) in enumerate(pending or ()):
                if name == event.tool_name:
                    del pending[i]  # pyright: ignore[reportOptionalSubscript]  # enumerating it: not None here
                    attributes[semconv.GEN_AI_TOOL_CALL_ID] = call_id
                    break
        node = self._new_node(event, _TOOL, f"{semconv.OP_EXECUTE_TOOL} {event.tool_name}", attributes)
        node.agent = event.agent_role
        self._add(node)

    def _on_alias(self, source: Any, event: Any) -> None:
        self._add(_Node(event.event_id, _ALIAS, event.parent_event_id, current_rollout()))

    # --- end handlers ---------------------------------------------------------------------------------------------
    def _on_llm_end(self, source: Any, event: Any) -> None:
        if event.type == "llm_call_completed":
            end = _End(time_ns(event.timestamp), llm_end_attributes(event))
            calls = tool_call_ids(event.response)
            if calls:
                with self._lock:
                    queue = self._pending_calls.setdefault(str(event.agent_role), deque(maxlen=_MAX_PENDING_CALLS))
                    queue.extend(calls)
        else:
            end = _End(time_ns(event.timestamp), {}, error=str(event.error))
        with self._lock:
            # Keyed by call id: a custom BaseLLM that emits outside ``llm_call_context`` gets a fresh call id per
            # event, so the started event id is the fallback key.
            node = self._llm_by_call.pop(event.call_id, None)
            if node is None and event.started_event_id is not None:
                node = self._nodes.get(event.started_event_id)
            if node is None:
                self._early_ends[event.call_id] = end
                if event.started_event_id is not None:
                    self._early_ends[event.started_event_id] = end
                return
            self._finish(node, end)

    def _on_end(self, source: Any, event: Any) -> None:
        attributes: dict[str, AttributeValue] = {}
        error: BaseException | str | None = None
        error_type: str | None = None
        kind = _KIND_OF_END.get(event.type)
        if event.type == "tool_usage_finished":
            attributes[semconv.GEN_AI_TOOL_CALL_RESULT] = tool_result(event.output)
            failure = getattr(event, "failure", None)  # newer than some 1.15 releases
            if failure is not None:  # the tool returned a ToolFailure: it ran but did not do its job
                error, error_type = str(failure.message), "ToolFailure"
        elif event.type == "tool_usage_error":
            error = event.error if isinstance(event.error, BaseException) else str(event.error)
        elif event.type == "task_failed":
            error = str(event.error)
            error_class = getattr(event, "error_type", None)  # newer than some 1.15 releases
            if isinstance(error_class, type):
                error_type = f"{error_class.__module__}.{error_class.__qualname__}"
        elif hasattr(event, "error"):
            error = str(event.error)
        end = _End(time_ns(event.timestamp), attributes, error, error_type)
        with self._lock:
            if kind == _CREW:
                node = self._crews.pop(id(source), None)
                if node is None:
                    self._early_ends[_crew_key(source)] = end
                    return
                self._finish(node, end)
                return
            node = self._nodes.get(event.started_event_id) if event.started_event_id else None
            # Should the scope stack be off here too, the nearest ancestor of the right kind is the one that ended.
            while node is not None and kind is not None and node.kind != kind:
                node = self._nodes.get(node.parent_event_id) if node.parent_event_id else None
            if node is None:
                if event.started_event_id:
                    self._early_ends[event.started_event_id] = end
                return
            self._finish(node, end)

    # --- the tree (all below runs under self._lock) ---------------------------------------------------------------
    def _add(self, node: _Node) -> None:
        with self._lock:
            if node.kind != _ALIAS and node.end is None:
                node.end = self._early_ends.pop(node.event_id, None)
            if node.parent_event_id is None and time.monotonic() - self._last_sweep > _SWEEP_EVERY_S:
                self._sweep()  # forget long-finished traces even when nobody calls flush()
            self._nodes[node.event_id] = node
            self._settle([node])

    def _settle(self, ready: list[_Node]) -> None:
        """Resolve ``ready`` nodes whose parents are known, then the nodes that waited for them."""
        while ready:
            node = ready.pop()
            if node.resolved:
                continue
            parent = self._parent_of(node)
            if parent is None:
                continue  # waits in self._waiting for its parent
            try:
                self._resolve(node, parent)
            except Exception as error:  # one span we cannot record must not strand the nodes waiting for it
                node.resolved = True
                self._failed(f"recording {node.kind} {node.name!r}", error)
            ready.extend(self._waiting.pop(node.event_id, ()))

    def _parent_of(self, node: _Node) -> _Node | None:
        """The resolved node whose span is the parent, ``_ROOT`` for a new trace, or None (then ``node`` waits)."""
        parent_id = node.parent_event_id
        if parent_id is None:
            return _ROOT
        parent = self._nodes.get(parent_id)
        if parent is None or not parent.resolved:
            self._waiting.setdefault(parent_id, []).append(node)
            return None
        return _ROOT if parent.trace is None else parent

    def _resolve(self, node: _Node, parent: _Node) -> None:
        node.resolved = True
        if parent is not _ROOT:
            node.trace, node.agent = parent.trace, node.agent or parent.agent
            if node.kind == _ALIAS:
                node.span = parent.span
            elif parent.trace is not None and parent.trace.tracer is not None:
                context = Context() if parent.span is None else trace.set_span_in_context(parent.span, Context())
                self._start_span(node, parent.trace, context)
        elif node.kind != _ALIAS:
            rollout = node.rollout
            if rollout is None:  # not inside a rollout: not ours to record (its descendants neither)
                node.trace = _Trace(None, {}, node)
            else:
                tracer = self._tracer or tracing.get_tracer(_TRACER_NAME)
                stamp = {semconv.ROLLOUT_ID: rollout.rollout_id, semconv.ATTEMPT_ID: rollout.attempt_id}
                node.trace = _Trace(tracer, stamp, node)
                self._start_span(node, node.trace, Context())
            self._traces.append(node.trace)
        if node.end is not None:
            self._finish(node, node.end)

    def _start_span(self, node: _Node, info: _Trace, context: Context) -> None:
        assert info.tracer is not None
        attributes = node.attributes
        attributes.update(info.stamp)
        attributes[semconv.SPAN_SOURCE] = semconv.SOURCE_HOOK
        if node.kind == _LLM and node.agent is None:
            node.agent = _NO_AGENT
        if node.agent is not None:
            attributes[semconv.GEN_AI_AGENT_NAME] = node.agent
        kind = SpanKind.CLIENT if node.kind == _LLM else SpanKind.INTERNAL
        node.span = info.tracer.start_span(
            node.name, context=context, kind=kind, attributes=attributes, start_time=node.start_ns
        )
        node.attributes = {}  # now on the span; no second copy per open node

    def _finish(self, node: _Node, end: _End) -> None:
        if node.ended:
            return
        node.end = end
        if not node.resolved:
            return  # ended before its parent was known; _resolve applies it
        node.ended = True
        span = node.span
        if span is not None and node.kind != _ALIAS:
            try:
                if end.attributes:
                    span.set_attributes(end.attributes)
                if end.error is not None:
                    _record_error(span, end, node.kind)
            finally:
                span.end(end_time=max(end.time_ns, node.start_ns))
        if node.trace is not None and node.trace.root is node:
            node.trace.ended_at = time.monotonic()

    def _sweep(self, *, flushed: bool = False) -> None:
        """Close and forget finished traces: every one after a flush of the bus, else those finished long ago."""
        now = self._last_sweep = time.monotonic()
        done = [t for t in self._traces if t.ended_at is not None and (flushed or now - t.ended_at > _STALE_S)]
        finished = {id(info) for info in done}
        for info in done:
            if info.tracer is None or info.root.end is None:
                continue
            for parent_id, waiting in list(self._waiting.items()):
                # A scope kind we do not alias hid these nodes' parent: attach them to the root of their rollout.
                for node in [n for n in waiting if self._belongs(n, info)]:
                    waiting.remove(node)
                    node.parent_event_id = info.root.event_id
                    self._settle([node])
                if not waiting:
                    self._waiting.pop(parent_id, None)
        for key, node in list(self._nodes.items()):
            if node.trace is not None and id(node.trace) in finished:
                if not node.ended and node.span is not None and node.kind != _ALIAS:
                    root_end = node.trace.root.end
                    self._finish(node, node.end or _End(root_end.time_ns if root_end else node.start_ns, {}))
                del self._nodes[key]
                if node.call_id is not None:
                    self._llm_by_call.pop(node.call_id, None)
            elif node.resolved and node.trace is None and now - node.created > _ROOT_ALIAS_TTL_S:
                del self._nodes[key]  # a root alias (a user's Flow) long gone
        for key, end in list(self._early_ends.items()):
            if now - end.received > _STALE_S:
                del self._early_ends[key]
        self._traces = [info for info in self._traces if id(info) not in finished]

    @staticmethod
    def _belongs(node: _Node, info: _Trace) -> bool:
        rollout, root_end = node.rollout, info.root.end
        return (
            rollout is not None
            and root_end is not None
            and info.stamp.get(semconv.ROLLOUT_ID) == rollout.rollout_id
            and node.start_ns <= root_end.time_ns
        )

    # --- flush ----------------------------------------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait for CrewAI's pending handlers, then close every span of finished crews; False on timeout."""
        done = crewai_event_bus.flush(timeout=timeout_s)
        if done:
            with self._lock:
                self._sweep(flushed=True)
        return done

    @property
    def open_spans(self) -> int:
        """Spans started and not yet ended (a leak check for tests: 0 after a crew finishes and flush())."""
        with self._lock:
            return sum(
                1 for node in self._nodes.values() if node.kind != _ALIAS and node.span is not None and not node.ended
            )


def _crew_key(crew: Any) -> str:
    return f"crew:{id(crew)}"


# The parent of a node that starts a trace (a sentinel node, so that parents type-check as nodes).
_ROOT: Final = _Node("", _ALIAS, None, None, resolved=True)


def _record_error(span: Span, end: _End, kind: str) -> None:
    error = end.error
    if isinstance(error, BaseException):
        span.record_exception(error, timestamp=end.time_ns)
        error_type = type(error).__qualname__
        message = f"{type(error).__name__}: {error}"
    else:
        # CrewAI passes most errors as text; the exception class only on failed tasks (TaskFailedEvent.error_type).
        error_type = end.error_type or f"crewai.{kind}_error"
        attributes: dict[str, AttributeValue] = {"exception.message": str(error), "exception.type": error_type}
        span.add_event("exception", attributes, timestamp=end.time_ns)
        message = str(error)
    span.set_attribute(semconv.ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, message))
