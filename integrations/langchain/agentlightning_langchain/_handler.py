"""The LangChain callback handler that records LLM, tool and agent runs as OpenTelemetry spans.

Parentage comes from LangChain's own ``run_id`` / ``parent_run_id`` (kept in a dict under a lock), never from the
ambient OpenTelemetry context: LangGraph runs tools on worker threads and async nodes on other tasks, where the
"current span" is not the caller's. For the same reason the rollout is captured once, when the outermost run
starts, and written explicitly on every span of that run tree.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv, tracing
from agentlightning.tracing import current_rollout
from agentlightning_langchain._messages import (
    input_messages_json,
    prompt_messages_json,
    result_attributes,
    to_json,
    tool_result_text,
)

logger = logging.getLogger("agentlightning_langchain")

_TRACER_NAME = "agentlightning_langchain"
# The nodes of langgraph.prebuilt.create_react_agent, which names its graph (create_react_agent(name="assistant"))
# but not its nodes: their runs carry langgraph_node "agent"/"tools" and no lc_agent_name. Inside a named graph they
# take the enclosing agent's name, so agents="assistant" selects them. LangGraph's name for an unnamed graph:
_PREBUILT_NODES = frozenset({"agent", "tools"})
_UNNAMED_GRAPH = "LangGraph"


@dataclass(slots=True)
class _Run:
    """A LangChain run that owns a span (skipped chains alias their nearest recorded ancestor instead)."""

    run_id: UUID
    span: Span
    agent: str | None
    # Tracer, rollout attributes and fallback agent name of the whole run tree, fixed when its root started (see
    # the module docstring). The fallback (the root run's name) names the agent of LLM calls made outside any
    # LangGraph node or named agent, e.g. a bare ``prompt | model`` chain.
    tracer: Tracer
    stamp: Mapping[str, AttributeValue]
    fallback_agent: str


def _is_control_flow(error: BaseException) -> bool:
    # LangGraph signals interrupts and Command(goto=...) handoffs by raising GraphBubbleUp subclasses, and a caller
    # that stops iterating graph.stream() early closes it with GeneratorExit: neither is a failure of the agent.
    # GraphBubbleUp is matched by name so this package does not depend on langgraph.
    if isinstance(error, GeneratorExit):
        return True
    return any(cls.__name__ == "GraphBubbleUp" for cls in type(error).__mro__)


_Callback = TypeVar("_Callback", bound=Callable[..., None])


class LightningCallbackHandler(BaseCallbackHandler):
    """Records a LangChain/LangGraph run as Agent Lightning spans: one per LLM call, tool call and agent (node).

    Use it as ``graph.invoke(x, config={"callbacks": [LightningCallbackHandler()]})``, or attach it to every run
    inside a rollout with :func:`agentlightning_langchain.instrument`. ``agent_names`` maps a LangGraph node name
    or an ``lc_agent_name`` to the agent name written as ``gen_ai.agent.name`` (default: the name itself).
    """

    # Called in the caller's thread or task instead of LangChain's executor: the handler never blocks (span
    # processing is batched off-thread by the tracing pipeline) and running inline keeps callbacks ordered.
    run_inline = True
    raise_error = False

    def __init__(self, *, agent_names: Mapping[str, str] | None = None, tracer: Tracer | None = None) -> None:
        """Create a handler; ``tracer`` defaults to the Agent Lightning tracer of the process."""
        super().__init__()
        self._agent_names: dict[str, str] = dict(agent_names or {})
        self._tracer = tracer
        self._runs: dict[UUID, _Run] = {}
        self._lock = threading.Lock()
        self._failures = 0

    # --- boundary: no callback may raise into the user's graph ------------------------------------------------------
    @staticmethod
    def _at_boundary(callback: _Callback) -> _Callback:
        """Make a callback log its own failures instead of raising them into the user's graph (STYLE.md habit 3)."""
        where = callback.__name__

        @functools.wraps(callback)
        def guarded(self: LightningCallbackHandler, *args: Any, **kwargs: Any) -> None:
            try:
                callback(self, *args, **kwargs)
            except Exception as error:
                self._failed(where, error)

        return cast(_Callback, guarded)

    def _failed(self, where: str, error: Exception) -> None:
        """Log a failure inside a callback: the first one as a warning, later ones at debug level."""
        self._failures += 1
        if self._failures == 1:
            logger.warning(
                "agentlightning_langchain: %s failed; the run continues but its spans may be incomplete "
                "(further failures are logged at debug level)",
                where,
                exc_info=error,
            )
        else:
            logger.debug(
                "agentlightning_langchain: %s failed (%d failures so far)", where, self._failures, exc_info=error
            )

    # Runs we never record: retrievers, retries and custom events are not part of the span contract.
    @property
    def ignore_retriever(self) -> bool:
        """Retriever runs are not recorded."""
        return True

    @property
    def ignore_retry(self) -> bool:
        """Retry notifications are not recorded."""
        return True

    @property
    def ignore_custom_event(self) -> bool:
        """Custom events are not recorded."""
        return True

    @_at_boundary
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an agent span for a node/agent run, a root span for the outermost run; skip other chains."""
        self._start_chain(serialized, run_id, parent_run_id, metadata, kwargs.get("name"))

    @_at_boundary
    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Close the chain's span, if it has one."""
        self._end(run_id)

    @_at_boundary
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an LLM span with the input messages, tool definitions, model and provider."""
        # LangChain starts one run per prompt of a batch, so each run sees exactly one message list.
        prompt = input_messages_json(messages[0] if messages else [])
        self._start_llm(serialized, prompt, run_id, parent_run_id, metadata, kwargs)

    @_at_boundary
    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an LLM span for a completion-style model (its prompt is recorded as one user message)."""
        prompt = prompt_messages_json(prompts[0] if prompts else "")
        self._start_llm(serialized, prompt, run_id, parent_run_id, metadata, kwargs)

    @_at_boundary
    def on_llm_end(
        self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        """Close the LLM span with output messages, tool calls, usage, finish reasons and the response id."""
        self._end(run_id, outcome=lambda: result_attributes(response))

    @_at_boundary
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open a tool span with the tool name, call id and arguments."""
        self._start_tool(serialized, input_str, inputs, run_id, parent_run_id, metadata, kwargs)

    @_at_boundary
    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Close the tool span with the tool's result."""
        self._end(run_id, outcome=lambda: {semconv.GEN_AI_TOOL_CALL_RESULT: tool_result_text(output)})

    @_at_boundary
    def on_chain_error(
        self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        """Record the exception (the user's, the model's or a tool's) on the run's span and close it."""
        self._end(run_id, error=error)

    # Every kind of run fails the same way; one method serves all three (LangChain calls them by name).
    on_llm_error = on_chain_error
    on_tool_error = on_chain_error

    # --- internals ------------------------------------------------------------------------------------------------
    def _agent_name(self, metadata: Mapping[str, Any] | None, parent_run_id: UUID | None) -> str | None:
        if not metadata:
            return None
        node = metadata.get("langgraph_node")
        agent = metadata.get("lc_agent_name")
        # An explicit mapping wins; among the framework's names, the agent's own name beats the graph node's.
        for key in (node, agent):
            if isinstance(key, str) and key in self._agent_names:
                return self._agent_names[key]
        if isinstance(agent, str) and agent:
            return agent
        if isinstance(node, str) and node:
            if node in _PREBUILT_NODES:
                return self._enclosing_agent(parent_run_id) or node
            return node
        return None

    def _enclosing_agent(self, parent_run_id: UUID | None) -> str | None:
        """The name of the agent a prebuilt graph's node runs in: its parent's agent, else the named graph's."""
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:
            return None
        if parent.agent is not None:
            return parent.agent
        return parent.fallback_agent if parent.fallback_agent != _UNNAMED_GRAPH else None

    def _pop(self, run_id: UUID) -> _Run | None:
        """Forget ``run_id``; returns its run if it owns a span (None if unknown or an alias of an ancestor)."""
        with self._lock:
            run = self._runs.pop(run_id, None)
        return run if run is not None and run.run_id == run_id else None

    def _open(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str,
        kind: SpanKind,
        attributes: dict[str, AttributeValue],
        agent: str | None,
        label: str,
        *,
        needs_agent: bool = False,
    ) -> _Run:
        """Start a span under the span of ``parent_run_id`` (or as a new trace) and remember it under ``run_id``.

        ``label`` is the run's own name (the tree's fallback agent name if this is the root); ``needs_agent``
        makes sure the span gets an agent name (LLM spans always carry one).
        """
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:
            # The outermost run we see: capture tracer and rollout now, in the caller's context (children may run
            # on worker threads where the rollout context is not set).
            tracer = self._tracer or tracing.get_tracer(_TRACER_NAME)
            rollout = current_rollout()
            stamp: Mapping[str, AttributeValue] = (
                {semconv.ROLLOUT_ID: rollout.rollout_id, semconv.ATTEMPT_ID: rollout.attempt_id}
                if rollout is not None
                else {}
            )
            context = Context()
            fallback = self._agent_names.get(label, label)
        else:
            tracer, stamp, fallback = parent.tracer, parent.stamp, parent.fallback_agent
            context = trace.set_span_in_context(parent.span, Context())
            if agent is None:
                agent = parent.agent
        if agent is None and needs_agent:
            agent = fallback
        attributes.update(stamp)
        attributes[semconv.SPAN_SOURCE] = semconv.SOURCE_HOOK
        if agent is not None:
            attributes[semconv.GEN_AI_AGENT_NAME] = agent
        span = tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        run = _Run(run_id, span, agent, tracer, stamp, fallback)
        with self._lock:
            self._runs[run_id] = run
        return run

    def _start_chain(
        self,
        serialized: Mapping[str, Any] | None,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: Mapping[str, Any] | None,
        run_name: Any,
    ) -> None:
        agent = self._agent_name(metadata, parent_run_id)
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            if parent is not None and (agent is None or agent == parent.agent):
                # A plain chain (or a chain inside the same agent): alias the parent so that its children attach
                # to the parent's span. Costs one dict entry, no span.
                self._runs[run_id] = parent
                return
        name = run_name if isinstance(run_name, str) and run_name else (serialized or {}).get("name") or "chain"
        attributes: dict[str, AttributeValue] = {}
        if agent is not None:
            attributes[semconv.GEN_AI_OPERATION_NAME] = semconv.OP_INVOKE_AGENT
            span_name = f"{semconv.OP_INVOKE_AGENT} {agent}"
        else:
            # The outermost run without an agent name (e.g. the graph itself): it roots the trace so that every
            # node of one invocation shares one trace.
            span_name = str(name)
        self._open(run_id, parent_run_id, span_name, SpanKind.INTERNAL, attributes, agent, str(name))

    def _start_llm(
        self,
        serialized: Mapping[str, Any] | None,
        prompt_json: str,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: Mapping[str, Any] | None,
        extra: Mapping[str, Any],
    ) -> None:
        meta: Mapping[str, Any] = metadata or {}
        params: Mapping[str, Any] = extra.get("invocation_params") or {}
        model = meta.get("ls_model_name") or params.get("model") or params.get("model_name")
        attributes: dict[str, AttributeValue] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.GEN_AI_INPUT_MESSAGES: prompt_json,
        }
        provider = meta.get("ls_provider")
        if isinstance(provider, str):
            attributes[semconv.GEN_AI_PROVIDER_NAME] = provider
        if isinstance(model, str):
            attributes[semconv.GEN_AI_REQUEST_MODEL] = model
        temperature = meta.get("ls_temperature", params.get("temperature"))
        if isinstance(temperature, int | float) and not isinstance(temperature, bool):
            attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] = float(temperature)
        max_tokens = meta.get("ls_max_tokens", params.get("max_tokens"))
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
            attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
        tools = params.get("tools")
        if tools:
            attributes[semconv.GEN_AI_TOOL_DEFINITIONS] = to_json(tools)
        label = str(extra.get("name") or (serialized or {}).get("name") or "llm")
        self._open(
            run_id,
            parent_run_id,
            f"{semconv.OP_CHAT} {model if isinstance(model, str) else label}",
            SpanKind.CLIENT,
            attributes,
            self._agent_name(meta, parent_run_id),
            label,
            needs_agent=True,
        )

    def _start_tool(
        self,
        serialized: Mapping[str, Any] | None,
        input_str: str,
        inputs: Mapping[str, Any] | None,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: Mapping[str, Any] | None,
        extra: Mapping[str, Any],
    ) -> None:
        name = (serialized or {}).get("name") or extra.get("name") or "tool"
        attributes: dict[str, AttributeValue] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL,
            semconv.GEN_AI_TOOL_NAME: str(name),
            semconv.GEN_AI_TOOL_CALL_ARGUMENTS: to_json(inputs) if inputs is not None else input_str,
        }
        call_id = extra.get("tool_call_id")
        if isinstance(call_id, str):
            attributes[semconv.GEN_AI_TOOL_CALL_ID] = call_id
        self._open(
            run_id,
            parent_run_id,
            f"{semconv.OP_EXECUTE_TOOL} {name}",
            SpanKind.INTERNAL,
            attributes,
            self._agent_name(metadata, parent_run_id),
            str(name),
        )

    def _end(
        self,
        run_id: UUID,
        *,
        error: BaseException | None = None,
        outcome: Callable[[], Mapping[str, AttributeValue]] | None = None,
    ) -> None:
        """Close the span of ``run_id`` (if it owns one) with the attributes of ``outcome`` or the ``error``."""
        run = self._pop(run_id)
        if run is None:
            return
        span = run.span
        try:
            if outcome is not None:
                span.set_attributes(outcome())
            if error is not None and not _is_control_flow(error):
                span.record_exception(error)
                span.set_attribute(semconv.ERROR_TYPE, type(error).__qualname__)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        finally:
            span.end()  # a span we failed to complete is still closed and delivered

    @property
    def open_runs(self) -> int:
        """Number of runs whose span is still open (a leak check for tests; 0 after every run finishes)."""
        with self._lock:
            return sum(1 for run_id, run in self._runs.items() if run.run_id == run_id)
