"""A lean OpenTelemetry tracer for the spans Agent Lightning records itself (the default ``LightningTracer``).

The SDK's ``TracerProvider`` validates every element of every sequence attribute through several layers of Python
(``BoundedAttributes`` / ``_clean_attribute_value``) and runs a sampler, id generator, metrics hooks and a processor
fan-out per span: most of the agent thread's cost per LLM-call span (two token-id lists), measured in
``bench/peer/ours.py``. This module implements the OpenTelemetry *API* (``TracerProvider``, ``Tracer``, ``Span``)
directly, with the SDK's default behaviour and nothing else:

- parent from the given or current context, new trace ids for roots, parent-based sampling (a child of an unsampled
  parent is a non-recording span), trace state and the random-trace-id flag inherited as the SDK does;
- attributes checked once per value (a homogeneous sequence of one primitive type is one ``set(map(type, ...))``),
  kept as the SDK keeps them (sequences as tuples), within the SDK's span limits (``OTEL_SPAN_*`` variables);
- status, events, links, ``record_exception``, ``update_name``, ``is_recording`` and context-manager semantics as
  in the SDK, including the warnings on use after ``end``.

Not implemented, as no span of ours needs it: counts of attributes/events/links dropped by the limits (reported as
0), the SDK's experimental ``_on_ending`` processor hook, tracer configurators and the SDK's internal span metrics.

A span is an SDK :class:`~opentelemetry.sdk.trace.ReadableSpan` too, so span processors (ours and any added with
:meth:`LeanTracerProvider.add_span_processor`) and exporters read it like an SDK span. Settings this tracer does not
implement (another sampler in ``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED=true``) make ``LightningTracer`` fall
back to the SDK's provider: see :func:`sdk_settings_in_environment`.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import sys
import threading
import traceback
import weakref
from collections.abc import Iterator, Mapping, Sequence
from time import time_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import context as context_api, trace as trace_api
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,  # pyright: ignore[reportDeprecated]  # the SDK still writes it; spans stay identical
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util._decorator import (
    _agnosticcontextmanager,  # pyright: ignore[reportPrivateUsage]  # what the API's Tracer signature returns
)

from agentlightning.otel import OTelAttributeValue, clean_attribute_value

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Span as SdkSpan
    from opentelemetry.util.types import Attributes

__all__ = ["LeanSpan", "LeanTracer", "LeanTracerProvider", "sdk_settings_in_environment"]

logger = logging.getLogger(__name__)

# Environment variables that make the SDK's TracerProvider behave otherwise than this tracer, with the values that
# do not (the SDK's defaults: parent-based always-on sampling, enabled).
_SDK_ONLY_SETTINGS: dict[str, tuple[str, ...]] = {
    "OTEL_TRACES_SAMPLER": ("", "parentbased_always_on"),
    "OTEL_SDK_DISABLED": ("", "false"),
}

_PRIMITIVES: frozenset[type] = frozenset((str, bool, int, float))
_UNSET = Status(StatusCode.UNSET)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED_RANDOM = TraceFlags(TraceFlags.DEFAULT | TraceFlags.RANDOM_TRACE_ID)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_getrandbits = random.getrandbits
_current_span = trace_api.get_current_span
_set_span_in_context = trace_api.set_span_in_context


def sdk_settings_in_environment() -> list[str]:
    """The OTEL_* variables set in the environment to behaviour that only the SDK's provider implements."""
    return [
        f"{name}={os.environ[name]}"
        for name, defaults in _SDK_ONLY_SETTINGS.items()
        if os.environ.get(name, "").strip().lower() not in defaults
    ]


def _limit(value: int | None) -> int:
    return sys.maxsize if value is None else value


class _Limits:
    """The SDK's span limits, read once per provider (``SpanLimits`` reads the ``OTEL_*_LIMIT`` variables)."""

    __slots__ = ("event_attributes", "events", "link_attributes", "links", "span_attributes", "value_length")

    def __init__(self, limits: SpanLimits) -> None:
        self.span_attributes = _limit(limits.max_span_attributes)
        self.events = _limit(limits.max_events)
        self.links = _limit(limits.max_links)
        self.event_attributes = _limit(limits.max_event_attributes)
        self.link_attributes = _limit(limits.max_link_attributes)
        self.value_length: int | None = limits.max_span_attribute_length


def _clean(attributes: Attributes, max_count: int, max_length: int | None) -> dict[str, OTelAttributeValue]:
    """A new dict of the valid attributes, as the SDK would keep them (the oldest dropped beyond ``max_count``)."""
    cleaned: dict[str, OTelAttributeValue] = {}
    if not attributes:
        return cleaned
    if max_length is None and len(attributes) <= max_count:
        # The common case, inlined: no key repeats in a mapping and no limit applies.
        for key, value in attributes.items():
            if type(value) in _PRIMITIVES and type(key) is str and key:
                cleaned[key] = value  # pyright: ignore[reportArgumentType]  # a primitive: checked just above
                continue
            _put(cleaned, key, value, max_count, max_length)
        return cleaned
    for key, value in attributes.items():
        _put(cleaned, key, value, max_count, max_length)
    return cleaned


def _put(
    attributes: dict[str, OTelAttributeValue], key: str, value: object, max_count: int, max_length: int | None
) -> None:
    if not key or not isinstance(key, str):  # pyright: ignore[reportUnnecessaryIsInstance]  # callers may be untyped
        logger.warning("invalid attribute key %r: it must be a non-empty string; dropping the attribute", key)
        return
    cleaned = clean_attribute_value(value, max_length)
    if cleaned is None or max_count <= 0:
        return
    if key in attributes:
        del attributes[key]  # a key set again moves to the end, as in the SDK
    elif len(attributes) >= max_count:
        del attributes[next(iter(attributes))]
    attributes[key] = cleaned


def _append_bounded(items: list[Any], item: object, limit: int) -> None:
    """Append, dropping the oldest item beyond ``limit`` (the SDK's BoundedList)."""
    if len(items) >= limit:
        if not items:
            return
        del items[0]
    items.append(item)


def _start_links(links: Sequence[Link], limits: _Limits) -> list[Link]:
    kept = [
        Link(link.context, _clean(link.attributes, limits.link_attributes, limits.value_length))
        for link in links
        if link and _valid_link(link.context, link.attributes)
    ]
    return kept[len(kept) - limits.links :] if len(kept) > limits.links else kept


def _valid_link(context: SpanContext | None, attributes: Attributes) -> bool:
    return bool(context and (context.is_valid or (attributes or context.trace_state)))


class LeanSpan(trace_api.Span, ReadableSpan):
    """A recording span of :class:`LeanTracer`: the OpenTelemetry API span, readable like an SDK span once ended."""

    def __init__(
        self,
        tracer: LeanTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, OTelAttributeValue],
        links: list[Link],
        start_time: int,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> None:
        # ReadableSpan's fields, set directly: its __init__ would build a Resource when given none.
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attrs = attributes
        self._attributes = attributes
        self._event_list: list[Event] = []
        self._events = self._event_list
        self._link_list = links
        self._links = links
        self._resource = tracer.resource
        self._instrumentation_scope = tracer.scope
        self._instrumentation_info = None
        self._status = _UNSET
        self._start_time = start_time
        self._end_time: int | None = None
        self._tracer = tracer
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LeanSpan(name={self._name!r}, context={self._context})"

    # --- API: reading ------------------------------------------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        """The span's own context (trace id, span id, flags)."""
        return self._context

    def is_recording(self) -> bool:
        """True until the span ends, as in the SDK."""
        return self._end_time is None

    # --- API: recording ----------------------------------------------------------------------------------------------
    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute (ignored with a warning once the span has ended)."""
        with self._lock:
            if self._end_time is not None:
                logger.warning("Setting attribute on ended span.")
                return
            limits = self._tracer.limits
            _put(self._attrs, key, value, limits.span_attributes, limits.value_length)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Set several attributes (ignored with a warning once the span has ended)."""
        with self._lock:
            if self._end_time is not None:
                logger.warning("Setting attribute on ended span.")
                return
            limits = self._tracer.limits
            attrs, max_count, max_length = self._attrs, limits.span_attributes, limits.value_length
            for key, value in attributes.items():
                # The common case, inlined (see _put): a new key with a primitive value and no limit in the way.
                fits = max_length is None and len(attrs) < max_count
                if fits and type(key) is str and key and type(value) in _PRIMITIVES and key not in attrs:
                    attrs[key] = value
                    continue
                _put(attrs, key, value, max_count, max_length)

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        """Add a timestamped event (now, unless ``timestamp`` is given)."""
        limits = self._tracer.limits
        event = Event(name, _clean(attributes, limits.event_attributes, limits.value_length), timestamp)
        with self._lock:
            if self._end_time is not None:
                logger.warning("Tried calling add_event on an ended span.")
                return
            _append_bounded(self._event_list, event, limits.events)

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        """Link another span (a link to an invalid context without attributes or trace state is ignored)."""
        if not _valid_link(context, attributes):
            return
        limits = self._tracer.limits
        link = Link(context, _clean(attributes, limits.link_attributes, limits.value_length))
        with self._lock:
            if self._end_time is not None:
                logger.warning("Tried calling add_link on an ended span.")
                return
            _append_bounded(self._link_list, link, limits.links)

    def update_name(self, name: str) -> None:
        """Rename the span (ignored with a warning once it has ended)."""
        with self._lock:
            if self._end_time is not None:
                logger.warning("Tried calling update_name on an ended span.")
                return
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """Set the status; OK is final and UNSET is ignored, as in the SDK."""
        with self._lock:
            if self._end_time is not None:
                logger.warning("Tried calling set_status on an ended span.")
                return
            if self._status.status_code is StatusCode.OK:
                return
            if isinstance(status, Status):
                if status.status_code is StatusCode.UNSET:
                    return
                if description is not None:
                    logger.warning(
                        "Description %s ignored. Use either `Status` or `(StatusCode, Description)`", description
                    )
                self._status = status
            elif status is not StatusCode.UNSET:
                self._status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """Record an exception as an ``exception`` event, with the SDK's attributes."""
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event_attributes: dict[str, Any] = {
            EXCEPTION_TYPE: f"{module}.{qualname}" if module and module != "builtins" else qualname,
            EXCEPTION_MESSAGE: str(exception),
            EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exception)),
            EXCEPTION_ESCAPED: str(escaped),
        }
        if attributes:
            event_attributes.update(attributes)
        self.add_event("exception", event_attributes, timestamp)

    def end(self, end_time: int | None = None) -> None:
        """End the span and hand it to the provider's span processors (a second end is ignored with a warning)."""
        with self._lock:
            if self._end_time is not None:
                logger.warning("Calling end() on an ended span.")
                return
            self._end_time = end_time if end_time is not None else time_ns()
        for processor in self._tracer.processors:
            processor.on_end(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        """End the span; an exception leaving the block is recorded as the SDK does (``with tracer.start_span()``)."""
        if exc_val is not None and self.is_recording():
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        super().__exit__(exc_type, exc_val, exc_tb)


class LeanTracer(trace_api.Tracer):
    """Starts :class:`LeanSpan` spans for one instrumentation scope of a :class:`LeanTracerProvider`."""

    def __init__(self, provider: LeanTracerProvider, scope: InstrumentationScope) -> None:
        self._provider = provider
        self.scope = scope
        self.resource = provider.resource
        self.limits = provider.limits

    @property
    def processors(self) -> tuple[SpanProcessor, ...]:
        """The provider's span processors, in the order they were added."""
        return self._provider.processors

    def start_span(
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        """Start a span under the current (or given) context's span, or as the root of a new trace."""
        # A span of another implementation may answer None (or worse) here: the SDK checks for both.
        parent = cast("object", _current_span(context).get_span_context())
        if parent is not None and not isinstance(parent, SpanContext):
            raise TypeError("parent_span_context must be a SpanContext or None.")
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = _getrandbits(128)
            while not trace_id:
                trace_id = _getrandbits(128)
            flags, trace_state, sampled = _SAMPLED_RANDOM, None, True
        else:
            # Parent-based sampling, the SDK's default: follow the parent's decision.
            trace_id = parent.trace_id
            random_id = parent.trace_flags.random_trace_id
            sampled = parent.trace_flags.sampled
            if sampled:
                flags = _SAMPLED_RANDOM if random_id else _SAMPLED
            else:
                flags = _NOT_SAMPLED_RANDOM if random_id else _NOT_SAMPLED
            trace_state = parent.trace_state
        span_id = _getrandbits(64)
        while not span_id:
            span_id = _getrandbits(64)
        span_context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=trace_state)
        if not sampled:
            return trace_api.NonRecordingSpan(span_context)
        limits = self.limits
        span = LeanSpan(
            self,
            name,
            span_context,
            parent,
            kind,
            _clean(attributes, limits.span_attributes, limits.value_length),
            _start_links(links, limits) if links else [],
            start_time if start_time is not None else time_ns(),
            record_exception,
            set_status_on_exception,
        )
        for processor in self._provider.processors:
            # Processors are typed for the SDK's span; a LeanSpan offers the same reading and recording methods.
            processor.on_start(cast("SdkSpan", span), parent_context=context)
        return span

    @_agnosticcontextmanager
    def start_as_current_span(
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        """Start a span and make it current for the block; same semantics as ``trace.use_span`` in the SDK."""
        span = self.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )
        try:
            token = context_api.attach(_set_span_in_context(span))
            try:
                yield span
            finally:
                context_api.detach(token)
        # Like trace.use_span: Exception only (GeneratorExit and friends are not errors), recorded without
        # "escaped", and re-raised.
        except Exception as exc:
            if span.is_recording():
                if record_exception:
                    span.record_exception(exc)
                if set_status_on_exception:
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            if end_on_exit:
                span.end()


class LeanTracerProvider(trace_api.TracerProvider):
    """An OpenTelemetry ``TracerProvider`` whose tracers make :class:`LeanSpan` spans; see the module docstring.

    It can be installed as the global provider (``trace.set_tracer_provider``) so that third-party
    instrumentations record through it; span processors added with :meth:`add_span_processor` see every span.
    """

    def __init__(self, resource: Resource, *, span_limits: SpanLimits | None = None) -> None:
        self.resource = resource
        self.limits = _Limits(span_limits or SpanLimits())
        self.processors: tuple[SpanProcessor, ...] = ()
        self._lock = threading.Lock()
        self._tracers: dict[tuple[str, str | None, str | None], LeanTracer] = {}
        self._shutdown = False
        _live_providers.add(self)

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace_api.Tracer:
        """A tracer for one instrumentation scope (the same object for the same name, version and schema)."""
        if not instrumenting_module_name:
            instrumenting_module_name = ""
            logger.error("get_tracer called with missing module name.")
        version = instrumenting_library_version or ""
        key = (instrumenting_module_name, version, schema_url)
        with self._lock:
            tracer = self._tracers.get(key) if not attributes else None
            if tracer is None:
                scope = InstrumentationScope(instrumenting_module_name, version, schema_url, attributes)
                tracer = LeanTracer(self, scope)
                if not attributes:
                    self._tracers[key] = tracer
            return tracer

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        """Have ``span_processor`` see every span started (``on_start``) and ended (``on_end``) from now on."""
        with self._lock:
            self.processors = (*self.processors, span_processor)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush every span processor; False if one did not finish in time."""
        return all([processor.force_flush(timeout_millis) for processor in self.processors])

    def shutdown(self) -> None:
        """Shut down every span processor (once)."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            processors = self.processors
        for processor in processors:
            processor.shutdown()


# Like the SDK's provider, shut down (and so flush) every span processor at exit; weakly held, unlike the SDK's
# per-provider atexit handler, so that a provider nobody uses any more can be collected.
_live_providers: weakref.WeakSet[LeanTracerProvider] = weakref.WeakSet()


def _shutdown_at_exit() -> None:
    for provider in list(_live_providers):
        provider.shutdown()


atexit.register(_shutdown_at_exit)
