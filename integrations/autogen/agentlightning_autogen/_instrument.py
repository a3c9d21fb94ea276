"""``instrument()`` / ``uninstrument()``: install and remove the span processor gate and the wrappers.

Two things cannot be undone in OpenTelemetry, so they are done once and gated instead:

- A span processor cannot be removed from an SDK ``TracerProvider``: ours is added once per provider and forwards
  nothing while uninstrumented (or instrumented for another provider).
- The global TracerProvider can be set only once per process. AutoGen 0.7 records its agent and tool spans with the
  global one (``trace.get_tracer("autogen-core")``), so when none is set, :func:`instrument` sets a plain SDK
  ``TracerProvider`` (or the one passed in) as the global provider, and it stays after :func:`uninstrument`.

Everything else is exactly undone: each wrapped method gets its original back, and the ``__init_subclass__`` hook
that wraps model clients defined later (e.g. ``autogen_ext.models.openai`` imported after ``instrument()``) is removed.
"""

from __future__ import annotations

import importlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from autogen_agentchat.teams import BaseGroupChat
from autogen_core.models import ChatCompletionClient
from autogen_core.tools import BaseStreamTool, BaseTool
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from agentlightning_autogen._processor import (
    TRACER_NAME,
    AutogenSpanProcessor,
    InstrumentState,
    active_state,
    report_failure,
    set_state,
)
from agentlightning_autogen._wrappers import (
    WRAPPED,
    wrap_create,
    wrap_create_stream,
    wrap_openai_create,
    wrap_run_json,
    wrap_run_json_stream,
    wrap_team_run_stream,
)

_MISSING = object()
_CLIENT_METHODS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("create", wrap_create),
    ("create_stream", wrap_create_stream),
)
# Where the OpenAI SDK answers AutoGen's OpenAI/Azure clients (chat.completions.create, beta ... parse).
_OPENAI_MODULES = ("openai.resources.chat.completions", "openai.resources.beta.chat.completions")


@dataclass(frozen=True, slots=True)
class _Patch:
    owner: type
    name: str
    original: Any  # the owner's own attribute before patching, or _MISSING when it inherited it
    replacement: Any


_lock = threading.RLock()
_patches: list[_Patch] = []
_processors: weakref.WeakKeyDictionary[TracerProvider, AutogenSpanProcessor] = weakref.WeakKeyDictionary()


def instrument(tracer_provider: TracerProvider | None = None, *, keep_runtime_spans: bool = False) -> None:
    """Record AutoGen agents, teams, model calls and tool calls inside rollouts; a second call does nothing.

    ``tracer_provider`` is the OpenTelemetry SDK provider AutoGen records into: the global one by default (a new SDK
    provider is installed as the global one when none is set). AutoGen's runtime messaging spans and ``create_agent``
    spans are dropped unless ``keep_runtime_spans=True``.
    """
    with _lock:
        if active_state() is not None:
            return
        provider = _resolve_provider(tracer_provider)
        processor = _processors.get(provider)
        if processor is None:
            processor = AutogenSpanProcessor(provider)
            provider.add_span_processor(processor)
            _processors[provider] = processor
        set_state(InstrumentState(provider, provider.get_tracer(TRACER_NAME), processor, keep_runtime_spans))
        try:
            _install()
        except BaseException:
            _remove()
            set_state(None)
            raise


def uninstrument() -> None:
    """Stop recording: every wrapped method gets its original back (the exact inverse of :func:`instrument`)."""
    with _lock:
        if active_state() is None:
            return
        set_state(None)
        _remove()


def _resolve_provider(tracer_provider: TracerProvider | None) -> TracerProvider:
    current = trace.get_tracer_provider()
    if tracer_provider is not None:
        if not isinstance(tracer_provider, TracerProvider):  # pyright: ignore[reportUnnecessaryIsInstance]  # untyped callers
            raise TypeError(
                "agentlightning_autogen.instrument(tracer_provider=...) needs an OpenTelemetry SDK TracerProvider "
                f"(opentelemetry.sdk.trace.TracerProvider) to add its span processor to, got {type(tracer_provider)!r}"
            )
        if isinstance(current, TracerProvider) and current is not tracer_provider:
            raise ValueError(
                "AutoGen records its agent and tool spans with OpenTelemetry's global TracerProvider, which is "
                "already set to another provider; call instrument() without tracer_provider to use the global one"
            )
        if current is not tracer_provider:
            trace.set_tracer_provider(tracer_provider)
        return tracer_provider
    if isinstance(current, TracerProvider):
        return current
    if type(current) is not trace.ProxyTracerProvider:
        raise ValueError(
            f"the global TracerProvider is a {type(current).__name__}, not an OpenTelemetry SDK TracerProvider, so "
            "no span processor can be added to it; set an opentelemetry.sdk.trace.TracerProvider as the global "
            "provider (trace.set_tracer_provider) before agentlightning_autogen.instrument()"
        )
    trace.set_tracer_provider(TracerProvider())
    installed = trace.get_tracer_provider()
    if not isinstance(installed, TracerProvider):  # another thread set a non-SDK provider first
        raise ValueError(f"the global TracerProvider became a {type(installed).__name__}; pass an SDK provider")
    return installed


def _patch(owner: type, name: str, replacement: Any) -> None:
    _patches.append(_Patch(owner, name, owner.__dict__.get(name, _MISSING), replacement))
    setattr(owner, name, replacement)


def _remove() -> None:
    while _patches:
        patch = _patches.pop()
        if patch.owner.__dict__.get(patch.name, _MISSING) is not patch.replacement:
            continue  # someone patched over us since; leave theirs alone
        if patch.original is _MISSING:
            delattr(patch.owner, patch.name)
        else:
            setattr(patch.owner, patch.name, patch.original)


def _wraps_needed(owner: type, name: str) -> Any:
    """The owner's own method to wrap, or None (inherited, abstract, or already ours)."""
    method = owner.__dict__.get(name)
    if method is None or not callable(method) or getattr(method, "__isabstractmethod__", False):
        return None
    return None if getattr(method, WRAPPED, False) else method


def _wrap_client_class(cls: type) -> None:
    with _lock:
        if active_state() is None:
            return
        for name, wrap in _CLIENT_METHODS:
            method = _wraps_needed(cls, name)
            if method is not None:
                _patch(cls, name, wrap(method))
        _wrap_openai()


def _subclasses(root: type) -> Iterator[type]:
    seen: set[type] = set()
    stack = [root]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _wrap_openai() -> None:
    if "openai" not in sys.modules:
        return  # no OpenAI-based client in use yet; the subclass hook comes back here when one is defined
    for module_name in _OPENAI_MODULES:
        # The SDK loads its resource modules lazily (on first ``client.chat``), so load them to patch them now.
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an SDK version without this resource
            continue
        owner = getattr(module, "AsyncCompletions", None)
        if not isinstance(owner, type):
            continue
        for name in ("create", "parse"):
            method = _wraps_needed(owner, name)
            if method is not None:
                _patch(owner, name, wrap_openai_create(method))


def _on_new_client_class(cls: type[ChatCompletionClient], **kwargs: Any) -> None:
    """``ChatCompletionClient.__init_subclass__`` while instrumented: wrap clients defined after instrument()."""
    super(ChatCompletionClient, cls).__init_subclass__(**kwargs)
    try:
        _wrap_client_class(cls)
    except Exception as error:
        report_failure("wrapping a model client class", error)


def _install() -> None:
    for cls in _subclasses(ChatCompletionClient):
        _wrap_client_class(cls)
    _patch(ChatCompletionClient, "__init_subclass__", classmethod(_on_new_client_class))
    for owner, name, wrap in (
        (BaseTool, "run_json", wrap_run_json),
        (BaseStreamTool, "run_json_stream", wrap_run_json_stream),
        (BaseGroupChat, "run_stream", wrap_team_run_stream),
    ):
        method = _wraps_needed(owner, name)
        if method is not None:
            _patch(owner, name, wrap(method))
    _wrap_openai()
