"""The Agents SDK tracing processor that records agent, LLM and tool spans as Agent Lightning (OpenTelemetry) spans.

Mapping (SDK span type → span):

- trace → the root span of one OpenTelemetry trace (named after the workflow), so that the agents of a run, which
  the SDK makes siblings, form one tree;
- ``agent`` → ``invoke_agent {name}`` with ``gen_ai.agent.name``;
- ``generation`` / ``response`` → ``chat {model}``: input and output messages, tools, usage, response id, model,
  and the name of the agent whose turn made the call (with handoffs, each call belongs to the agent that made it);
- ``function`` → ``execute_tool {name}``: arguments, result and the model's call id;
- ``handoff`` → a ``handoff`` event on the agent span that handed off;
- everything else (task, turn, guardrail, custom, MCP listing...) records nothing; its children attach to the
  nearest recorded ancestor.

Parents come from the SDK's own span ids and parent ids (a dict under a lock), never from the ambient context: the
SDK runs tools and streamed turns on other tasks and threads. For the same reason the rollout is captured from
:func:`~agentlightning.tracing.current_rollout` when the SDK trace starts and written on every span of it.

Callbacks stay cheap: an OpenTelemetry span is started with the SDK span and ended with it (attributes are read
from the span data at the end, without dumping whole objects); export is the tracing pipeline's job, off-thread.

Function spans lack the tool call id (verified on openai-agents 0.24). It is joined from, in order:
``LightningRunHooks.on_tool_start`` (its ``ToolContext`` has the id while the function span is current), else the
function calls of the agent's latest LLM output, matched by tool name and arguments.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.exceptions import AgentsException
from agents.items import ModelResponse
from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    HandoffSpanData,
    ResponseSpanData,
    Span as SdkSpan,
    Trace,
    TracingProcessor,
    get_current_span,
)
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv, tracing
from agentlightning.tracing import current_rollout
from agentlightning_openai_agents import _convert
from agentlightning_openai_agents._convert import LLMOutput, ToolCall

logger = logging.getLogger("agentlightning_openai_agents")

_TRACER_NAME = "agentlightning_openai_agents"
_PROVIDER = "openai"


@dataclass(slots=True)
class _Trace:
    """One SDK trace: its tracer, rollout attributes and root span, fixed when it started."""

    tracer: Tracer
    stamp: Mapping[str, AttributeValue]
    root: Span


@dataclass(slots=True)
class _Agent:
    """The agent a span belongs to, with the tool calls its LLM asked for that no function span has claimed yet."""

    name: str | None
    span: Span
    calls: list[ToolCall] = field(default_factory=list[ToolCall])


@dataclass(slots=True)
class _Node:
    """A live SDK span: the OpenTelemetry span its children attach to (its own, or an ancestor's)."""

    trace: _Trace
    span: Span
    agent: _Agent
    owned: bool
    call_id: str | None = None  # function spans: set by LightningRunHooks.on_tool_start
    response_id: str | None = None  # non-streamed Chat Completions: set by the model wrapper of instrument()
    instructions: str | None = None  # LLM spans: the system prompt LightningRunHooks saw
    # LLM spans are leaves, so they are created when the call ends, with its start time and every attribute at
    # once (one attribute-cleaning pass instead of two: the cost that dominates); until then ``span`` is the parent.
    llm_start_ns: int | None = None
    llm_stamp: dict[str, AttributeValue] | None = None


@dataclass(slots=True)
class _HookCall:
    """An LLM call announced by ``RunHooks.on_llm_start``; recorded at ``on_llm_end`` unless the model traced it."""

    start_ns: int
    model: str | None
    instructions: str | None
    input_items: object
    covered: bool = False


def _user_exception(error: BaseException) -> BaseException:
    """The user's own exception inside the SDK's wrappers (``UserError`` from a failing tool has it as cause)."""
    seen: set[int] = set()
    while isinstance(error, AgentsException) and error.__cause__ is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__
    return error


class LightningTracingProcessor(TracingProcessor):
    """Records OpenAI Agents SDK runs as Agent Lightning spans: one per agent, LLM call and tool call.

    Register it with :func:`agentlightning_openai_agents.instrument` (or ``agents.add_trace_processor``). Runs inside
    a rollout are recorded; runs outside one are ignored. ``tracer`` defaults to the Agent Lightning tracer of the
    process (resolved when each SDK trace starts).
    """

    def __init__(self, *, tracer: Tracer | None = None) -> None:
        """Create a processor; ``tracer`` overrides the process-wide Agent Lightning tracer."""
        self._tracer = tracer
        self._lock = threading.Lock()
        self._traces: dict[str, _Trace] = {}
        self._nodes: dict[str, _Node] = {}
        self._hook_calls: dict[str, _HookCall] = {}
        self._failures = 0
        self._closed = False  # after shutdown: the SDK has no way to unregister a processor, so it goes inert

    # --- boundary: nothing below may raise into the user's agent -------------------------------------------------
    def _failed(self, where: str, error: Exception) -> None:
        self._failures += 1
        if self._failures == 1:
            logger.warning(
                "agentlightning_openai_agents: %s failed; the run continues but its spans may be incomplete "
                "(further failures are logged at debug level)",
                where,
                exc_info=error,
            )
        else:
            logger.debug("agentlightning_openai_agents: %s failed (%d so far)", where, self._failures, exc_info=error)

    def on_trace_start(self, trace: Trace) -> None:
        """Open the root span of the trace when it starts inside a rollout."""
        if self._closed:
            return
        try:
            self._start_trace(trace.trace_id, trace.name)
        except Exception as error:
            self._failed("on_trace_start", error)

    def on_trace_end(self, trace: Trace) -> None:
        """Close the root span of the trace."""
        try:
            with self._lock:
                state = self._traces.pop(trace.trace_id, None)
            if state is not None:
                state.root.end()
        except Exception as error:
            self._failed("on_trace_end", error)

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        """Open the span of an agent, LLM call or tool call."""
        if self._closed:
            return
        try:
            self._start_span(span)
        except Exception as error:
            self._failed("on_span_start", error)

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        """Fill the span from the SDK's span data and close it (errors become status ERROR + exception event)."""
        try:
            self._end_span(span)
        except Exception as error:
            self._failed("on_span_end", error)

    def shutdown(self) -> None:
        """End every span still open and ignore every later event (the SDK cannot unregister a processor)."""
        self._closed = True
        try:
            with self._lock:
                nodes, self._nodes = self._nodes, {}
                traces, self._traces = self._traces, {}
                self._hook_calls.clear()
            for node in nodes.values():
                if node.owned and node.llm_start_ns is None:
                    node.span.end()
            for state in traces.values():
                state.root.end()
        except Exception as error:
            self._failed("shutdown", error)

    def force_flush(self) -> None:
        """Deliver the spans of finished runs to the store (a no-op without an Agent Lightning tracer)."""
        try:
            lightning = tracing.get_lightning_tracer()
            if lightning is not None:
                lightning.flush()
        except Exception as error:
            self._failed("force_flush", error)

    @property
    def open_spans(self) -> int:
        """SDK spans and traces still open (a leak check for tests: 0 once every run has finished)."""
        with self._lock:
            return len(self._nodes) + len(self._traces)

    # --- internals -------------------------------------------------------------------------------------------------
    def _start_trace(self, trace_id: str, name: str) -> _Trace | None:
        """Capture the rollout and open the root span, in the context of the code that started the trace."""
        rollout = current_rollout()
        if rollout is None:
            return None
        tracer = self._tracer or tracing.get_tracer(_TRACER_NAME)
        stamp: Mapping[str, AttributeValue] = {
            semconv.ROLLOUT_ID: rollout.rollout_id,
            semconv.ATTEMPT_ID: rollout.attempt_id,
        }
        attributes: dict[str, AttributeValue] = {**stamp, semconv.SPAN_SOURCE: semconv.SOURCE_HOOK}
        root = tracer.start_span(name or "agent workflow", context=Context(), attributes=attributes)
        state = _Trace(tracer, stamp, root)
        with self._lock:
            self._traces[trace_id] = state
        return state

    def _parent(self, span: SdkSpan[Any]) -> tuple[_Trace, Span, _Agent] | None:
        """(trace, span to attach to, agent) for a new SDK span; None when its trace is not recorded."""
        with self._lock:
            parent = self._nodes.get(span.parent_id) if span.parent_id is not None else None
            if parent is not None:
                return parent.trace, parent.span, parent.agent
            state = self._traces.get(span.trace_id)
        if state is None:
            # A trace that began before this processor was added, or whose start failed: adopt it if we are
            # inside a rollout now (otherwise it is not ours to record).
            state = self._start_trace(span.trace_id, "agent workflow")
            if state is None:
                return None
        return state, state.root, _Agent(None, state.root)

    def _start_span(self, span: SdkSpan[Any]) -> None:
        data = span.span_data
        # Spans that record nothing still need a node, so that their children find the recorded ancestor; but
        # outside a rollout nothing is recorded at all.
        found = self._parent(span)
        if found is None:
            return
        state, parent_span, agent = found
        if not isinstance(data, AgentSpanData | GenerationSpanData | ResponseSpanData | FunctionSpanData):
            with self._lock:
                self._nodes[span.span_id] = _Node(state, parent_span, agent, owned=False)
            return
        attributes: dict[str, AttributeValue] = {**state.stamp, semconv.SPAN_SOURCE: semconv.SOURCE_HOOK}
        node: _Node
        if isinstance(data, AgentSpanData):
            context = otel_trace.set_span_in_context(parent_span, Context())
            attributes[semconv.GEN_AI_OPERATION_NAME] = semconv.OP_INVOKE_AGENT
            attributes[semconv.GEN_AI_AGENT_NAME] = data.name
            own = state.tracer.start_span(f"{semconv.OP_INVOKE_AGENT} {data.name}", context, attributes=attributes)
            node = _Node(state, own, _Agent(data.name, own), owned=True)
        elif isinstance(data, GenerationSpanData | ResponseSpanData):
            attributes[semconv.GEN_AI_OPERATION_NAME] = semconv.OP_CHAT
            attributes[semconv.GEN_AI_PROVIDER_NAME] = _PROVIDER
            if agent.name is not None:
                attributes[semconv.GEN_AI_AGENT_NAME] = agent.name
            node = _Node(state, parent_span, agent, owned=True, llm_start_ns=time.time_ns(), llm_stamp=attributes)
        else:
            attributes[semconv.GEN_AI_OPERATION_NAME] = semconv.OP_EXECUTE_TOOL
            attributes[semconv.GEN_AI_TOOL_NAME] = data.name
            if agent.name is not None:
                attributes[semconv.GEN_AI_AGENT_NAME] = agent.name
            context = otel_trace.set_span_in_context(parent_span, Context())
            own = state.tracer.start_span(f"{semconv.OP_EXECUTE_TOOL} {data.name}", context, attributes=attributes)
            node = _Node(state, own, agent, owned=True)
        with self._lock:
            self._nodes[span.span_id] = node
            llm_hook = node.llm_start_ns is not None and span.parent_id is not None
            hook = self._hook_calls.get(span.parent_id) if llm_hook and span.parent_id is not None else None
        if hook is not None:
            # The model traces its own calls: the hook's record would be a duplicate, but its system prompt fills
            # what a Responses object does not echo back.
            hook.covered = True
            node.instructions = hook.instructions

    def _end_span(self, span: SdkSpan[Any]) -> None:
        with self._lock:
            node = self._nodes.pop(span.span_id, None)
            # An LLM call a hook announced but never finished (the model raised) dies with its turn.
            self._hook_calls.pop(span.span_id, None)
        if node is None:
            return
        data = span.span_data
        if isinstance(data, HandoffSpanData):
            node.agent.span.add_event(
                "handoff", {"handoff.from_agent": data.from_agent or "", "handoff.to_agent": data.to_agent or ""}
            )
            return
        if not node.owned:
            return
        if node.llm_start_ns is not None and node.llm_stamp is not None:
            attributes = node.llm_stamp
            if isinstance(data, GenerationSpanData):
                self._generation_attributes(data, node, attributes)
            elif isinstance(data, ResponseSpanData):
                self._response_attributes(data, node, attributes)
            model = attributes.get(semconv.GEN_AI_REQUEST_MODEL)
            context = otel_trace.set_span_in_context(node.span, Context())
            name = f"{semconv.OP_CHAT} {model}" if model else semconv.OP_CHAT
            target = node.trace.tracer.start_span(
                name, context, kind=SpanKind.CLIENT, attributes=attributes, start_time=node.llm_start_ns
            )
        else:
            target = node.span
            if isinstance(data, FunctionSpanData):
                tool_attributes: dict[str, AttributeValue] = {}
                self._function_attributes(data, node, tool_attributes)
                target.set_attributes(tool_attributes)
        error = span.error
        if error is not None:
            self._record_error(target, error.get("message") or "error", error.get("data"))
        target.end()

    def _record_error(self, span: Span, message: str, data: object) -> None:
        # The SDK reports a failure as data, but ends the span while the exception propagates (or is being
        # handled), so the exception itself is at hand; only used when the SDK marked the span as failed.
        raised = sys.exc_info()[1]
        detail = _convert.field(data, "error")
        if raised is not None:
            user = _user_exception(raised)
            span.record_exception(user)
            span.set_attribute(semconv.ERROR_TYPE, type(user).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(user).__name__}: {user}"))
            return
        kind = _convert.field(data, "name")
        text = f"{message}: {detail}" if detail else message
        span.add_event(
            "exception",
            {"exception.type": str(kind or "agents.SpanError"), "exception.message": text},
        )
        span.set_attribute(semconv.ERROR_TYPE, str(kind or "agents.SpanError"))
        span.set_status(Status(StatusCode.ERROR, text))

    def _generation_attributes(
        self, data: GenerationSpanData, node: _Node, attributes: dict[str, AttributeValue]
    ) -> None:
        if data.model:
            attributes[semconv.GEN_AI_REQUEST_MODEL] = str(data.model)
        _convert.request_settings_attributes(data.model_config, attributes)
        messages = list(data.input) if data.input is not None else None
        if messages is not None:
            attributes[semconv.GEN_AI_INPUT_MESSAGES] = _convert.to_json(messages)
            if messages and messages[0].get("role") == "system":
                attributes[semconv.GEN_AI_SYSTEM_INSTRUCTIONS] = _convert.to_json(messages[0].get("content"))
        output = _convert.generation_output(data.output) if data.output is not None else None
        if output is not None:
            output.response_id = output.response_id or node.response_id
            _convert.output_attributes(output, attributes)
            self._remember_calls(node.agent, output)
        elif node.response_id:
            attributes[semconv.GEN_AI_RESPONSE_ID] = node.response_id
        if data.usage:
            _convert.usage_attributes(data.usage, attributes)

    def _response_attributes(self, data: ResponseSpanData, node: _Node, attributes: dict[str, AttributeValue]) -> None:
        response = data.response
        instructions = _convert.field(response, "instructions")
        instructions = instructions if isinstance(instructions, str) else node.instructions
        if data.input is not None:
            messages = _convert.input_messages(instructions, data.input)
            attributes[semconv.GEN_AI_INPUT_MESSAGES] = _convert.to_json(messages)
        if instructions:
            attributes[semconv.GEN_AI_SYSTEM_INSTRUCTIONS] = _convert.to_json(instructions)
        if response is None:
            return
        model = response.model
        if model:
            attributes[semconv.GEN_AI_REQUEST_MODEL] = str(model)
        if response.tools:
            attributes[semconv.GEN_AI_TOOL_DEFINITIONS] = _convert.to_json(_convert.tool_definitions(response.tools))
        if response.temperature is not None:
            attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] = float(response.temperature)
        if response.max_output_tokens is not None:
            attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] = response.max_output_tokens
        output = _convert.response_object_output(response)
        _convert.output_attributes(output, attributes)
        _convert.usage_attributes(data.usage or response.usage, attributes)
        self._remember_calls(node.agent, output)

    def _remember_calls(self, agent: _Agent, output: LLMOutput) -> None:
        if output.calls:
            with self._lock:
                # Only the latest output's calls can still run: older unclaimed ones (handoffs, hosted tools) go.
                agent.calls = list(output.calls)

    def _function_attributes(self, data: FunctionSpanData, node: _Node, attributes: dict[str, AttributeValue]) -> None:
        arguments = data.input or ""
        attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
        if data.output is not None:
            attributes[semconv.GEN_AI_TOOL_CALL_RESULT] = _convert.result_text(data.output)
        call_id = node.call_id or self._claim_call(node.agent, data.name, arguments)
        if call_id:
            attributes[semconv.GEN_AI_TOOL_CALL_ID] = call_id

    def _claim_call(self, agent: _Agent, name: str, arguments: str) -> str | None:
        """The id of the pending call of this tool with these arguments (or, failing that, of this tool)."""
        with self._lock:
            candidates = [call for call in agent.calls if call.name == name]
            match = next((call for call in candidates if call.arguments == arguments), None)
            match = match or (candidates[0] if candidates else None)
            if match is None:
                return None
            agent.calls.remove(match)
            return match.call_id

    # --- entry points for LightningRunHooks, instrument()'s model wrapper, and custom models ------------------------
    def _current_node(self) -> tuple[str, _Node] | None:
        current = get_current_span()
        if current is None:
            return None
        with self._lock:
            node = self._nodes.get(current.span_id)
        return None if node is None else (current.span_id, node)

    def record_tool_call_id(self, call_id: str) -> None:
        """Give the SDK function span that is current (``on_tool_start`` runs inside it) its tool call id."""
        found = self._current_node()
        if found is not None:
            found[1].call_id = call_id

    def record_response_id(self, response_id: str) -> None:
        """Give the SDK generation span that is current its response id (for models that do not put it there)."""
        found = self._current_node()
        if found is not None:
            found[1].response_id = response_id

    def record_llm_start(self, model: str | None, instructions: str | None, input_items: object) -> None:
        """Remember an LLM call a run hook announced, under the SDK span current at the time (the agent's turn)."""
        current = get_current_span()
        if current is None:
            return
        call = _HookCall(time.time_ns(), model, instructions, input_items)
        with self._lock:
            self._hook_calls[current.span_id] = call

    def record_llm_end(self, response: ModelResponse) -> None:
        """Record the announced LLM call as a span, unless the model traced it itself (generation/response span)."""
        found = self._current_node()
        if found is None:
            return
        span_id, node = found
        with self._lock:
            call = self._hook_calls.pop(span_id, None)
        if call is None or call.covered:
            return
        state, agent = node.trace, node.agent
        attributes: dict[str, AttributeValue] = {
            **state.stamp,
            semconv.SPAN_SOURCE: semconv.SOURCE_HOOK,
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.GEN_AI_INPUT_MESSAGES: _convert.to_json(
                _convert.input_messages(call.instructions, call.input_items)
            ),
        }
        if agent.name is not None:
            attributes[semconv.GEN_AI_AGENT_NAME] = agent.name
        if call.model:
            attributes[semconv.GEN_AI_REQUEST_MODEL] = call.model
        if call.instructions:
            attributes[semconv.GEN_AI_SYSTEM_INSTRUCTIONS] = _convert.to_json(call.instructions)
        output = _convert.responses_output(list(response.output))
        output.response_id = output.response_id or response.response_id
        _convert.output_attributes(output, attributes)
        _convert.usage_attributes(response.usage, attributes)
        self._remember_calls(agent, output)
        # Started and ended with explicit times: the call is over, and its start is when the hook saw it begin.
        context = otel_trace.set_span_in_context(node.span, Context())
        name = f"{semconv.OP_CHAT} {call.model}" if call.model else semconv.OP_CHAT
        span = state.tracer.start_span(
            name, context, kind=SpanKind.CLIENT, attributes=attributes, start_time=call.start_ns
        )
        span.end()
