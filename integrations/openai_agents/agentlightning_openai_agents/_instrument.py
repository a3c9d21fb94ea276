"""Zero-line use: register one :class:`LightningTracingProcessor` with the Agents SDK, and take it away again.

The SDK's ``TraceProvider`` can add a processor or replace the whole list, but cannot remove one or list them
(verified on openai-agents 0.24). So :func:`instrument` reads the default provider's list (``_multi_processor``) to
drop the default exporter to OpenAI's servers, and :func:`uninstrument` rebuilds the list without ours, with the
exporter back where it was. The user's own processors are never touched.

The non-streamed Chat Completions model puts the completion's id on no span (its generation span holds the message,
not the completion), yet the adapter joins hook and proxy spans by ``gen_ai.response.id``; :func:`instrument`
therefore wraps its ``_fetch_response`` to hand the id to the processor while the generation span is current.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast

from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.tracing import TracingProcessor, get_trace_provider, set_trace_processors
from agents.tracing.processors import default_processor
from openai.types.chat import ChatCompletion

from agentlightning_openai_agents._processor import LightningTracingProcessor

logger = logging.getLogger("agentlightning_openai_agents")

_FETCH = "_fetch_response"


class _State:
    """What :func:`instrument` changed, so that :func:`uninstrument` can undo exactly that."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processor: LightningTracingProcessor | None = None
        self.dropped_exporter: tuple[int, TracingProcessor] | None = None  # (index, processor)
        self.original_fetch: Callable[..., Awaitable[Any]] | None = None
        self.wrapped_fetch: Callable[..., Awaitable[Any]] | None = None


_state = _State()


def registered_processors() -> list[TracingProcessor] | None:
    """The processors the SDK's default provider calls, in order; None for a provider we cannot inspect."""
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    processors = getattr(multi, "_processors", None)
    if not isinstance(processors, tuple):
        return None
    return list(cast(tuple[TracingProcessor, ...], processors))


def _wrap_fetch(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(original)
    async def fetch_response(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        processor = _state.processor
        if processor is not None and isinstance(result, ChatCompletion):
            try:
                processor.record_response_id(result.id)
            except Exception:  # our bookkeeping must never fail the user's model call
                logger.debug("agentlightning_openai_agents: noting a response id failed", exc_info=True)
        return result

    return fetch_response


def instrument(*, drop_default_exporter: bool = True) -> None:
    """Record every Agents SDK run inside a rollout; a second call while instrumented does nothing.

    ``drop_default_exporter`` (default True) also unregisters the SDK's default exporter, which would send every
    trace to OpenAI's servers; :func:`uninstrument` puts it back.
    """
    with _state.lock:
        if _state.processor is not None:
            return
        processor = LightningTracingProcessor()
        current = registered_processors()
        if drop_default_exporter and current is not None:
            exporter = default_processor()
            if exporter in current:
                index = current.index(exporter)
                current.pop(index)
                _state.dropped_exporter = (index, exporter)
        if current is not None:
            set_trace_processors([*current, processor])
        else:
            if drop_default_exporter:
                logger.warning(
                    "agentlightning_openai_agents: the SDK's trace provider is not its default one, so the default "
                    "exporter could not be dropped; call agents.set_trace_processors([...]) yourself"
                )
            get_trace_provider().register_processor(processor)
        original = cast(Callable[..., Awaitable[Any]] | None, getattr(OpenAIChatCompletionsModel, _FETCH, None))
        if original is not None and callable(original):
            wrapped = _wrap_fetch(original)
            setattr(OpenAIChatCompletionsModel, _FETCH, wrapped)
            _state.original_fetch, _state.wrapped_fetch = original, wrapped
        _state.processor = processor


def uninstrument() -> None:
    """Unregister the processor and restore what :func:`instrument` changed (its exact inverse)."""
    with _state.lock:
        processor = _state.processor
        if processor is None:
            return
        _state.processor = None
        current = registered_processors()
        if current is not None:
            remaining = [p for p in current if p is not processor]
            if _state.dropped_exporter is not None:
                index, exporter = _state.dropped_exporter
                if exporter not in remaining:
                    remaining.insert(min(index, len(remaining)), exporter)
            set_trace_processors(remaining)
        _state.dropped_exporter = None
        # Only put the original back if nobody wrapped ours since (their wrapper keeps calling ours, which then
        # does nothing because no processor is instrumented).
        installed = getattr(OpenAIChatCompletionsModel, _FETCH, None)
        if _state.wrapped_fetch is not None and installed is _state.wrapped_fetch:
            setattr(OpenAIChatCompletionsModel, _FETCH, _state.original_fetch)
        _state.original_fetch = _state.wrapped_fetch = None
        processor.shutdown()


def instrumented_processor() -> LightningTracingProcessor | None:
    """The registered processor while instrumented, else None (for the hooks, tests and diagnostics)."""
    return _state.processor
