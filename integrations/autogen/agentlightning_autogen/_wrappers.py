"""The wrappers :func:`instrument` installs: model calls become LLM spans, tool calls get arguments and results.

- ``ChatCompletionClient.create`` / ``create_stream`` (every implementation): one ``chat`` span per call, parented
  under the span current at the call (normally AutoGen's ``invoke_agent`` span of the calling agent), named for that
  agent. A client that delegates to another client (e.g. ``ChatCompletionCache``) records one span, not two: the
  call in progress lives in a ``ContextVar`` and nested calls pass straight through.
- ``BaseTool.run_json`` / ``BaseStreamTool.run_json_stream``: the arguments and the result (as the model sees it,
  ``return_value_as_string``) are added to AutoGen's own tool span.
- ``BaseGroupChat.run_stream`` (so also ``run``): an ``invoke_agent <team>`` span around the run, current while the
  team's embedded runtime starts, so every turn of the team lands in one trace under it, and LLM calls of the team
  itself (a selector's) are named for the team.
- ``openai`` ``AsyncCompletions.create`` / ``parse``: AutoGen's ``CreateResult`` drops the completion id, so the id
  (and model) of the response is read where the OpenAI client gets it, for the LLM span in progress only; it is the
  ``gen_ai.response.id`` that joins our span with the LLM proxy's span of the same call.

Every wrapper catches its own failures (reported once, then counted) and passes the user's exceptions through
unchanged, after recording them on the span.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from autogen_core.models import CreateResult
from opentelemetry import context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from agentlightning import semconv
from agentlightning.tracing import current_rollout
from agentlightning_autogen._convert import (
    input_messages_json,
    result_attributes,
    to_json,
    tool_arguments_json,
    tool_definitions_json,
)
from agentlightning_autogen._processor import (
    InstrumentState,
    ToolCall,
    active_state,
    pending_tool,
    report_failure,
)

#: Marks a function as one of our wrappers (its original is ``__wrapped__``); instrument() never wraps twice.
WRAPPED = "_agentlightning_autogen_wrapped"

#: The agent name of an LLM call made outside any agent span (e.g. a bare ``client.create`` in a rollout).
FALLBACK_AGENT = "autogen"

_Wrapper = TypeVar("_Wrapper", bound=Callable[..., Any])

#: What :func:`_step` returns once the stream is exhausted.
_END = object()


def _wrapper_of(original: Callable[..., Any]) -> Callable[[_Wrapper], _Wrapper]:
    """``functools.wraps(original)`` that also marks the wrapper as ours (see :data:`WRAPPED`)."""

    def mark(wrapper: _Wrapper) -> _Wrapper:
        functools.update_wrapper(wrapper, original)
        setattr(wrapper, WRAPPED, True)
        return wrapper

    return mark


def _guarded(where: str, action: Callable[[], object]) -> None:
    """Run a step of ours; its failure is reported, never raised into the user's run."""
    try:
        action()
    except Exception as error:
        report_failure(where, error)


async def _step(stream: AsyncIterator[Any], enter: Callable[[], Any], leave: Callable[[Any], object]) -> Any:
    """The next item of ``stream`` (:data:`_END` once exhausted), inside ``enter``/``leave`` only while it runs.

    What ``enter`` sets holds for the stream's own code, never while our caller handles an item.
    """
    token = enter()
    try:
        return await anext(stream, _END)
    finally:
        leave(token)


async def _close(stream: AsyncGenerator[Any], then: Callable[[], None]) -> None:
    """Close ``stream``, then run ``then`` even if closing fails."""
    try:
        await stream.aclose()
    finally:
        then()


@dataclass(slots=True)
class LLMCall:
    """The model call in progress: its span (None if it could not start) and what the OpenAI client reported."""

    span: Span | None
    response_id: str | None = None
    response_model: str | None = None


#: The recorded model call this task is inside; nested calls (a client delegating to another) pass through.
current_call: ContextVar[LLMCall | None] = ContextVar("agentlightning_autogen_llm_call", default=None)

_provider_names: dict[type, str | None] = {}


def _provider_name(client: object) -> str | None:
    cls = type(client)
    if cls not in _provider_names:
        module = cls.__module__
        name: str | None = None
        if module.startswith("autogen_ext.models."):
            family = module.split(".")[2]
            name = "azure.ai.openai" if family == "openai" and "Azure" in cls.__name__ else family
        _provider_names[cls] = name
    return _provider_names[cls]


def _request_model(client: object) -> str | None:
    # OpenAI, Azure, Anthropic and Ollama clients of autogen-ext keep the request arguments in ``_create_args``.
    create_args = getattr(client, "_create_args", None)
    if isinstance(create_args, Mapping):
        model = cast(Mapping[str, Any], create_args).get("model")
        if isinstance(model, str):
            return model
    model = getattr(client, "model", None)
    return model if isinstance(model, str) else None


def _stamp(attributes: dict[str, AttributeValue]) -> None:
    """Name the rollout and attempt explicitly, from the context of the call that opens the span."""
    rollout = current_rollout()
    if rollout is not None:
        attributes[semconv.ROLLOUT_ID] = rollout.rollout_id
        attributes[semconv.ATTEMPT_ID] = rollout.attempt_id


def _parent_context(state: InstrumentState) -> tuple[Context | None, str | None]:
    """The context to start a span in (None: the current one) and the agent name of its parent."""
    current = trace.get_current_span()
    parent, agent = state.processor.locate(current)
    if parent is None:
        return Context(), None  # a new trace: no span, or only dropped runtime spans, above us
    if parent is current.get_span_context():
        return None, agent
    return trace.set_span_in_context(NonRecordingSpan(parent), Context()), agent


def start_llm_span(client: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Span | None:
    """Open the LLM span of a ``create``/``create_stream`` call (None when not instrumented)."""
    state = active_state()
    if state is None:
        return None
    messages = args[0] if args else kwargs.get("messages", ())
    model = _request_model(client)
    context, agent = _parent_context(state)
    attributes: dict[str, AttributeValue] = {
        semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
        semconv.GEN_AI_INPUT_MESSAGES: input_messages_json(messages),
        semconv.GEN_AI_AGENT_NAME: agent or FALLBACK_AGENT,
        semconv.SPAN_SOURCE: semconv.SOURCE_HOOK,
    }
    _stamp(attributes)
    tools = kwargs.get("tools")
    if tools:
        attributes[semconv.GEN_AI_TOOL_DEFINITIONS] = tool_definitions_json(tools)
    provider = _provider_name(client)
    if provider is not None:
        attributes[semconv.GEN_AI_PROVIDER_NAME] = provider
    if model is not None:
        attributes[semconv.GEN_AI_REQUEST_MODEL] = model
    name = f"{semconv.OP_CHAT} {model}" if model else semconv.OP_CHAT
    return state.tracer.start_span(name, context=context, kind=SpanKind.CLIENT, attributes=attributes)


def _begin(client: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> LLMCall:
    try:
        return LLMCall(start_llm_span(client, args, kwargs))
    except Exception as error:
        report_failure("LLM span start", error)
        return LLMCall(None)


def record_error(span: Span, error: BaseException) -> None:
    """Record the user's exception on a span (status ERROR, ``exception`` event, ``error.type``)."""
    span.record_exception(error)
    span.set_attribute(semconv.ERROR_TYPE, type(error).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def finish_llm_span(call: LLMCall, result: CreateResult | None, error: BaseException | None) -> None:
    """Close the LLM span with the result (output, usage, finish reason, response id/model) or the error."""
    span = call.span
    if span is None:
        return
    try:
        _complete(span, call, result, error)
    except Exception as failure:
        report_failure("LLM span end", failure)


def _complete(span: Span, call: LLMCall, result: CreateResult | None, error: BaseException | None) -> None:
    try:
        if result is not None:
            attributes = result_attributes(result)
            if call.response_id is not None:
                attributes[semconv.GEN_AI_RESPONSE_ID] = call.response_id
            if call.response_model is not None:
                attributes[semconv.GEN_AI_RESPONSE_MODEL] = call.response_model
            span.set_attributes(attributes)
        # A consumer that stops iterating a stream early closes it with GeneratorExit: not a failure of the model.
        if error is not None and not isinstance(error, GeneratorExit):
            record_error(span, error)
    finally:
        span.end()  # a span we failed to complete is still closed and delivered


# --- model clients ------------------------------------------------------------------------------------------------
def wrap_create(original: Callable[..., Awaitable[CreateResult]]) -> Callable[..., Awaitable[CreateResult]]:
    """Wrap a client's ``create`` so each call becomes an LLM span."""

    @_wrapper_of(original)
    async def create(self: object, *args: Any, **kwargs: Any) -> CreateResult:
        if active_state() is None or current_call.get() is not None:
            return await original(self, *args, **kwargs)
        call = _begin(self, args, kwargs)
        token = current_call.set(call)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as error:
            finish_llm_span(call, None, error)
            raise
        finally:
            current_call.reset(token)
        finish_llm_span(call, result, None)
        return result

    return create


async def _recorded_stream(
    client: object, original: Callable[..., AsyncGenerator[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncGenerator[Any]:
    call = _begin(client, args, kwargs)
    stream = original(client, *args, **kwargs)
    result: CreateResult | None = None
    failure: BaseException | None = None
    try:
        # Marked as inside the call only while the client runs, never while our caller handles a chunk.
        while (item := await _step(stream, functools.partial(current_call.set, call), current_call.reset)) is not _END:
            if isinstance(item, CreateResult):
                result = item
            yield item
    except BaseException as error:
        failure = error
        raise
    finally:
        await _close(stream, lambda: finish_llm_span(call, result, failure))


def wrap_create_stream(original: Callable[..., AsyncGenerator[Any]]) -> Callable[..., AsyncGenerator[Any]]:
    """Wrap a client's ``create_stream`` so each streamed call becomes one LLM span."""

    @_wrapper_of(original)
    def create_stream(self: object, *args: Any, **kwargs: Any) -> AsyncGenerator[Any]:
        if active_state() is None or current_call.get() is not None:
            return original(self, *args, **kwargs)
        return _recorded_stream(self, original, args, kwargs)

    return create_stream


# --- tools --------------------------------------------------------------------------------------------------------
def _new_tool_call(arguments: Any) -> ToolCall | None:
    try:
        return ToolCall(tool_arguments_json(arguments))
    except Exception as error:
        report_failure("tool arguments", error)
        return None


def _result_text(tool: Any, value: Any) -> str:
    try:
        text = tool.return_value_as_string(value)
        return text if isinstance(text, str) else to_json(text)
    except Exception:  # a tool whose result has no text form: keep the JSON of it rather than nothing
        return to_json(value)


def wrap_run_json(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap ``BaseTool.run_json`` so AutoGen's tool span gets the call's arguments and result."""

    @_wrapper_of(original)
    async def run_json(self: Any, args: Mapping[str, Any], *rest: Any, **kwargs: Any) -> Any:
        call = _new_tool_call(args) if active_state() is not None else None
        if call is None:
            return await original(self, args, *rest, **kwargs)
        token = pending_tool.set(call)
        try:
            value = await original(self, args, *rest, **kwargs)
            call.result = _result_text(self, value)
            return value
        finally:
            pending_tool.reset(token)
            _guarded("tool span end", call.release)

    return run_json


async def _recorded_tool_stream(
    tool: Any, stream: AsyncGenerator[Any], call: ToolCall, last: list[Any]
) -> AsyncGenerator[Any]:
    try:
        while (item := await _step(stream, functools.partial(pending_tool.set, call), pending_tool.reset)) is not _END:
            last[:] = [item]
            yield item
        if last:
            call.result = _result_text(tool, last[0])
    finally:
        await _close(stream, lambda: _guarded("tool span end", call.release))


def wrap_run_json_stream(original: Callable[..., AsyncGenerator[Any]]) -> Callable[..., AsyncGenerator[Any]]:
    """Wrap ``BaseStreamTool.run_json_stream``: the tool span gets the arguments and the final value."""

    @_wrapper_of(original)
    def run_json_stream(self: Any, args: Mapping[str, Any], *rest: Any, **kwargs: Any) -> AsyncGenerator[Any]:
        call = _new_tool_call(args) if active_state() is not None else None
        if call is None:
            return original(self, args, *rest, **kwargs)
        return _recorded_tool_stream(self, original(self, args, *rest, **kwargs), call, [])

    return run_json_stream


# --- teams --------------------------------------------------------------------------------------------------------
def start_team_span(team: Any) -> Span | None:
    """Open the ``invoke_agent <team>`` span of a team run (None when not instrumented)."""
    state = active_state()
    if state is None:
        return None
    name = getattr(team, "name", None)
    name = name if isinstance(name, str) and name else type(team).__name__
    context, _ = _parent_context(state)
    attributes: dict[str, AttributeValue] = {
        semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT,
        semconv.GEN_AI_AGENT_NAME: name,
        semconv.SPAN_SOURCE: semconv.SOURCE_HOOK,
    }
    _stamp(attributes)
    return state.tracer.start_span(f"{semconv.OP_INVOKE_AGENT} {name}", context=context, attributes=attributes)


async def _recorded_team_stream(team: Any, stream: AsyncGenerator[Any]) -> AsyncGenerator[Any]:
    span: Span | None = None
    try:
        span = start_team_span(team)
    except Exception as error:
        report_failure("team span start", error)
    if span is None:
        enter, leave = _no_context, _no_context
    else:
        run_context = trace.set_span_in_context(span)
        enter, leave = functools.partial(otel_context.attach, run_context), otel_context.detach
    failure: BaseException | None = None
    try:
        # Current only while the team's code runs (its embedded runtime starts inside the first step and copies
        # this context into its message loop), never across a yield to the caller.
        while (item := await _step(stream, enter, leave)) is not _END:
            yield item
    except BaseException as error:
        failure = error
        raise
    finally:
        await _close(stream, lambda: _end_team_span(span, failure))


def _no_context(token: object = None) -> None:
    """Neither enter nor leave a context (a team run whose span could not start)."""


def _end_team_span(span: Span | None, failure: BaseException | None) -> None:
    if span is None:
        return
    if failure is not None and not isinstance(failure, GeneratorExit):
        _guarded("team span end", lambda: record_error(span, failure))
    _guarded("team span end", span.end)


def wrap_team_run_stream(original: Callable[..., AsyncGenerator[Any]]) -> Callable[..., AsyncGenerator[Any]]:
    """Wrap ``BaseGroupChat.run_stream`` so a team run is one ``invoke_agent`` span over its agents' spans."""

    @_wrapper_of(original)
    def run_stream(self: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any]:
        if active_state() is None:
            return original(self, *args, **kwargs)
        return _recorded_team_stream(self, original(self, *args, **kwargs))

    return run_stream


# --- openai client: the response id CreateResult drops ---------------------------------------------------------------
class _ObservedStream:
    """An ``openai.AsyncStream`` passed through unchanged, noting the completion id of its first chunk."""

    def __init__(self, stream: Any, call: LLMCall) -> None:
        self._stream = stream
        self._call = call

    def __aiter__(self) -> _ObservedStream:
        return self

    async def __anext__(self) -> Any:
        chunk = await self._stream.__anext__()
        if self._call.response_id is None:
            _note_response(self._call, chunk)
        return chunk

    async def __aenter__(self) -> _ObservedStream:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        return await self._stream.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _note_response(call: LLMCall, response: object) -> None:
    response_id = getattr(response, "id", None)
    if isinstance(response_id, str) and response_id:
        call.response_id = response_id
    model = getattr(response, "model", None)
    if isinstance(model, str) and model:
        call.response_model = model


def wrap_openai_create(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap openai's ``AsyncCompletions.create``/``parse`` to note the response id for the LLM span in progress."""

    @_wrapper_of(original)
    async def create(self: object, *args: Any, **kwargs: Any) -> Any:
        response = await original(self, *args, **kwargs)
        call = current_call.get()
        if call is None or call.span is None:
            return response
        try:
            if hasattr(response, "__anext__"):  # stream=True: an openai.AsyncStream of chunks
                return _ObservedStream(response, call)
            _note_response(call, response)
        except Exception as error:
            report_failure("response id", error)
        return response

    return create
