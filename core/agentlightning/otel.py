"""Conversions from OpenTelemetry into the Agent Lightning :class:`~agentlightning.types.Span` model.

Two sources: an SDK :class:`~opentelemetry.sdk.trace.ReadableSpan` (our own span processor) and an OTLP
``ExportTraceServiceRequest`` (the OTLP/HTTP ingest endpoint, for agents instrumented with any OpenTelemetry SDK).
Ids become lowercase hex (32 digits for traces, 16 for spans), times stay integer nanoseconds.

Rollout and attempt ids, when not passed explicitly, come from the span attributes ``agentlightning.rollout_id`` /
``agentlightning.attempt_id`` and then from the resource attributes of the same names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from agentlightning import semconv
from agentlightning.types.spans import (
    Attributes,
    AttributeValue,
    Span,
    SpanEvent,
    SpanKind,
    SpanLink,
    SpanStatus,
    StatusCode,
)

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["span_from_readable", "spans_from_otlp"]

# OTLP enum numbers (opentelemetry/proto/trace/v1/trace.proto); UNSPECIFIED means INTERNAL per the spec.
_OTLP_KINDS: dict[int, SpanKind] = {
    0: "INTERNAL",
    1: "INTERNAL",
    2: "SERVER",
    3: "CLIENT",
    4: "PRODUCER",
    5: "CONSUMER",
}
_OTLP_STATUS: dict[int, StatusCode] = {0: "UNSET", 1: "OK", 2: "ERROR"}


def span_from_readable(span: ReadableSpan, *, rollout_id: str | None = None, attempt_id: str | None = None) -> Span:
    """Convert a finished SDK span into a :class:`Span`; raises ValueError when rollout/attempt ids are unknown."""
    context = span.context
    if context is None:
        raise ValueError(f"span {span.name!r} has no span context; only spans created by an SDK tracer convert")
    attributes = _otel_attributes(span.attributes)
    resource = _otel_attributes(span.resource.attributes)
    rollout_id, attempt_id = _resolve_ids(
        span.name, f"{context.span_id:016x}", attributes, resource, rollout_id, attempt_id, via="rollout_context"
    )
    parent = span.parent
    status = span.status
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_id=None if parent is None else f"{parent.span_id:016x}",
        name=span.name,
        kind=span.kind.name,
        start_time=span.start_time or 0,
        end_time=span.end_time,
        status=SpanStatus(code=status.status_code.name, message=status.description),
        attributes=attributes,
        events=[
            SpanEvent(name=event.name, timestamp=event.timestamp, attributes=_otel_attributes(event.attributes))
            for event in span.events
        ],
        links=[
            SpanLink(
                trace_id=f"{link.context.trace_id:032x}",
                span_id=f"{link.context.span_id:016x}",
                attributes=_otel_attributes(link.attributes),
            )
            for link in span.links
        ],
        resource=resource,
    )


def spans_from_otlp(
    request: ExportTraceServiceRequest | bytes, *, rollout_id: str | None = None, attempt_id: str | None = None
) -> tuple[list[Span], list[str]]:
    """Convert an OTLP trace export (message or serialized protobuf) into spans plus reasons for rejected spans.

    A span is rejected, not raised on, when it lacks rollout/attempt ids or has malformed ids, so that an HTTP
    server can answer with an OTLP partial success naming what was wrong.
    """
    if isinstance(request, bytes):
        from agentlightning.extras import require_server_extra

        require_server_extra("decoding OTLP protobuf (agentlightning.otel.spans_from_otlp)")
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        try:
            request = ExportTraceServiceRequest.FromString(request)
        except Exception as exc:  # protobuf raises DecodeError, whose module path varies between implementations
            raise ValueError(f"body is not a serialized OTLP ExportTraceServiceRequest: {exc}") from exc
    spans: list[Span] = []
    rejected: list[str] = []
    for resource_spans in request.resource_spans:
        resource = _proto_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for proto_span in scope_spans.spans:
                try:
                    spans.append(_span_from_proto(proto_span, resource, rollout_id, attempt_id))
                except ValueError as exc:
                    rejected.append(str(exc))
    return spans, rejected


def _span_from_proto(proto: ProtoSpan, resource: Attributes, rollout_id: str | None, attempt_id: str | None) -> Span:
    span_id = proto.span_id.hex()
    if len(proto.trace_id) != 16 or len(proto.span_id) != 8:
        raise ValueError(
            f"span {proto.name!r} has a malformed id (trace_id {proto.trace_id.hex()!r}, span_id {span_id!r}); "
            "OTLP requires 16-byte trace ids and 8-byte span ids"
        )
    attributes = _proto_attributes(proto.attributes)
    attributes.setdefault(semconv.SPAN_SOURCE, semconv.SOURCE_OTLP)
    rollout_id, attempt_id = _resolve_ids(
        proto.name, span_id, attributes, resource, rollout_id, attempt_id, via=f"header {semconv.HEADER_ROLLOUT_ID}"
    )
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id=proto.trace_id.hex(),
        span_id=span_id,
        parent_id=proto.parent_span_id.hex() if len(proto.parent_span_id) == 8 else None,
        name=proto.name,
        kind=_OTLP_KINDS.get(proto.kind, "INTERNAL"),
        start_time=proto.start_time_unix_nano,
        end_time=proto.end_time_unix_nano or None,
        status=SpanStatus(code=_OTLP_STATUS.get(proto.status.code, "UNSET"), message=proto.status.message or None),
        attributes=attributes,
        events=[
            SpanEvent(name=event.name, timestamp=event.time_unix_nano, attributes=_proto_attributes(event.attributes))
            for event in proto.events
        ],
        links=[
            SpanLink(
                trace_id=link.trace_id.hex(), span_id=link.span_id.hex(), attributes=_proto_attributes(link.attributes)
            )
            for link in proto.links
        ],
        resource=resource,
    )


def _resolve_ids(
    name: str,
    span_id: str,
    attributes: Attributes,
    resource: Attributes,
    rollout_id: str | None,
    attempt_id: str | None,
    *,
    via: str,
) -> tuple[str, str]:
    """Pick rollout/attempt ids: explicit argument, then span attribute, then resource attribute."""
    rollout_id = rollout_id or _id_from(attributes, resource, semconv.ROLLOUT_ID)
    attempt_id = attempt_id or _id_from(attributes, resource, semconv.ATTEMPT_ID)
    missing = [key for key, value in ((semconv.ROLLOUT_ID, rollout_id), (semconv.ATTEMPT_ID, attempt_id)) if not value]
    if missing or rollout_id is None or attempt_id is None:
        raise ValueError(
            f"span {name!r} (span_id {span_id}) has no {' or '.join(missing)}: set it as a span or resource "
            f"attribute, or attribute the span through {via}"
        )
    return rollout_id, attempt_id


def _id_from(attributes: Attributes, resource: Attributes, key: str) -> str | None:
    value = attributes.get(key, resource.get(key))
    return value if isinstance(value, str) and value else None


def _otel_attributes(attributes: Mapping[str, Any] | None) -> Attributes:
    """OTel SDK attributes (primitives or homogeneous tuples, already validated by the SDK) → our flat dict."""
    if not attributes:
        return {}
    result = dict(attributes)
    for key, value in result.items():
        if type(value) is tuple:  # the SDK stores sequences as tuples; replacing values while iterating is safe
            result[key] = list(cast(tuple[Any, ...], value))
    return result


def _proto_attributes(key_values: Sequence[KeyValue]) -> Attributes:
    result: Attributes = {}
    for kv in key_values:
        value = _attribute_value(kv.value)
        if value is not None:
            result[kv.key] = value
    return result


def _attribute_value(value: AnyValue) -> AttributeValue | None:
    """One OTLP AnyValue as an attribute: primitives as is, homogeneous arrays as lists, anything nested as JSON."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        items: list[Any] = [_json_value(item) for item in value.array_value.values]
        if not items:
            return []
        kinds: set[type] = {type(item) for item in items}
        if len(kinds) == 1 and kinds <= {str, bool, int, float}:
            return cast(AttributeValue, items)  # one primitive type, checked just above
        return json.dumps(items, separators=(",", ":"))
    if which == "kvlist_value":
        return json.dumps(_json_value(value), separators=(",", ":"))
    primitive = _json_value(value)
    return primitive if isinstance(primitive, str | bool | int | float) else None


def _json_value(value: AnyValue) -> Any:
    """An AnyValue as plain JSON-able Python (bytes as hex, kvlists as dicts)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if which == "bytes_value":
        return value.bytes_value.hex()
    if which == "array_value":
        return [_json_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _json_value(kv.value) for kv in value.kvlist_value.values}
    return None
