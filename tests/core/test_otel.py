"""OpenTelemetry → Span conversions keep ids, parents, kinds, status, attributes, events, links, resource and times."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from agentlightning import semconv
from agentlightning.otel import span_from_readable, spans_from_otlp
from agentlightning.types import Span

ATTRIBUTES = {
    "s": "text",
    "b": True,
    "i": 7,
    "f": 0.25,
    "ls": ("a", "b"),
    "lb": (True, False),
    "li": (1, 2, 3),
    "lf": (0.5, 1.5),
}


@pytest.fixture
def finished() -> Iterator[list[ReadableSpan]]:
    """Three real SDK spans: a root, a CLIENT child with everything set, and a span linked to the root."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", semconv.ROLLOUT_ID: "ro-res"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("root", attributes={semconv.ATTEMPT_ID: "at-1"}) as root:
        with tracer.start_as_current_span(
            "child", kind=SpanKind.CLIENT, attributes={**ATTRIBUTES, semconv.ATTEMPT_ID: "at-1"}
        ) as child:
            child.add_event("thinking", {"step": 2, "tags": ("x", "y")}, timestamp=1_700_000_000_000_000_123)
            child.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span(
            "linked",
            links=[Link(root.get_span_context(), {"why": "retry"})],
            attributes={semconv.ROLLOUT_ID: "ro-attr", semconv.ATTEMPT_ID: "at-1"},
        ):
            pass
    yield list(exporter.get_finished_spans())
    provider.shutdown()


def _by_name(spans: list[Span]) -> dict[str, Span]:
    return {span.name: span for span in spans}


def test_readable_span_keeps_everything(finished: list[ReadableSpan]) -> None:
    spans = _by_name([span_from_readable(s) for s in finished])
    readable = {s.name: s for s in finished}
    root, child, linked = spans["root"], spans["child"], spans["linked"]

    ctx = readable["child"].context
    assert ctx is not None
    assert child.trace_id == f"{ctx.trace_id:032x}" and len(child.trace_id) == 32
    assert child.span_id == f"{ctx.span_id:016x}" and len(child.span_id) == 16
    assert child.trace_id == child.trace_id.lower()
    assert child.parent_id == root.span_id
    assert root.parent_id is None
    assert child.kind == "CLIENT" and root.kind == "INTERNAL"
    assert child.status.code == "ERROR" and child.status.message == "boom"
    assert root.status.code == "UNSET"
    assert child.start_time == readable["child"].start_time
    assert child.end_time == readable["child"].end_time
    assert child.start_time > 1_600_000_000 * 10**9  # nanoseconds since the epoch

    expected = {k: list(v) if isinstance(v, tuple) else v for k, v in ATTRIBUTES.items()}
    assert {k: child.attributes[k] for k in expected} == expected
    assert type(child.attributes["b"]) is bool and type(child.attributes["i"]) is int

    assert [(e.name, e.timestamp, e.attributes) for e in child.events] == [
        ("thinking", 1_700_000_000_000_000_123, {"step": 2, "tags": ["x", "y"]})
    ]
    assert [(lk.trace_id, lk.span_id, lk.attributes) for lk in linked.links] == [
        (root.trace_id, root.span_id, {"why": "retry"})
    ]
    assert child.resource["service.name"] == "svc"


def test_rollout_ids_come_from_arguments_then_attributes_then_resource(finished: list[ReadableSpan]) -> None:
    spans = _by_name([span_from_readable(s) for s in finished])
    assert (spans["root"].rollout_id, spans["root"].attempt_id) == ("ro-res", "at-1")  # resource
    assert spans["linked"].rollout_id == "ro-attr"  # span attribute beats resource
    explicit = span_from_readable(finished[0], rollout_id="ro-x", attempt_id="at-x")
    assert (explicit.rollout_id, explicit.attempt_id) == ("ro-x", "at-x")


def test_readable_span_without_ids_is_a_clear_error() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("orphan"):
        pass
    (orphan,) = exporter.get_finished_spans()
    with pytest.raises(ValueError, match=r"'orphan'.*agentlightning\.rollout_id or agentlightning\.attempt_id"):
        span_from_readable(orphan)
    with pytest.raises(ValueError, match=r"has no agentlightning\.attempt_id"):
        span_from_readable(orphan, rollout_id="ro-1")
    provider.shutdown()


def test_converted_span_round_trips_json(finished: list[ReadableSpan]) -> None:
    for readable in finished:
        span = span_from_readable(readable)
        assert Span.model_validate_json(span.model_dump_json()) == span


@pytest.mark.parametrize("serialized", [False, True], ids=["message", "bytes"])
def test_otlp_matches_readable_conversion(finished: list[ReadableSpan], serialized: bool) -> None:
    request = encode_spans(finished)
    spans, rejected = spans_from_otlp(request.SerializeToString() if serialized else request)
    assert rejected == []
    from_otlp = _by_name(spans)
    for readable in finished:
        direct = span_from_readable(readable)
        via_otlp = from_otlp[readable.name]
        assert via_otlp.attributes.pop(semconv.SPAN_SOURCE) == semconv.SOURCE_OTLP
        assert via_otlp == direct


def test_otlp_keeps_explicit_source_and_rejects_spans_without_ids(finished: list[ReadableSpan]) -> None:
    request = encode_spans(finished)
    orphan = ProtoSpan(
        trace_id=bytes(range(16)), span_id=bytes(range(8)), name="orphan", start_time_unix_nano=5, end_time_unix_nano=9
    )
    request.resource_spans.append(ResourceSpans(scope_spans=[ScopeSpans(spans=[orphan])]))
    spans, rejected = spans_from_otlp(request)
    assert sorted(s.name for s in spans) == ["child", "linked", "root"]
    assert len(rejected) == 1
    assert "'orphan'" in rejected[0] and semconv.ROLLOUT_ID in rejected[0] and semconv.HEADER_ROLLOUT_ID in rejected[0]

    # with ids passed in (from headers), the same span is accepted
    spans, rejected = spans_from_otlp(request, rollout_id="ro-h", attempt_id="at-h")
    assert rejected == []
    orphan_span = _by_name(spans)["orphan"]
    assert (orphan_span.rollout_id, orphan_span.attempt_id) == ("ro-h", "at-h")
    assert orphan_span.trace_id == bytes(range(16)).hex() and orphan_span.parent_id is None
    assert (orphan_span.start_time, orphan_span.end_time, orphan_span.kind) == (5, 9, "INTERNAL")


def test_otlp_rejects_malformed_ids() -> None:
    bad = ProtoSpan(trace_id=b"\x01" * 15, span_id=b"\x02" * 8, name="short")
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[bad])])])
    spans, rejected = spans_from_otlp(request, rollout_id="ro-1", attempt_id="at-1")
    assert spans == []
    assert "'short'" in rejected[0] and "16-byte" in rejected[0]


def test_otlp_any_values_convert_to_attributes() -> None:
    def kv(key: str, value: AnyValue) -> KeyValue:
        return KeyValue(key=key, value=value)

    def array(*values: AnyValue) -> AnyValue:
        return AnyValue(array_value=ArrayValue(values=list(values)))

    s, i, d, b = (
        AnyValue(string_value="x"),
        AnyValue(int_value=3),
        AnyValue(double_value=0.5),
        AnyValue(bool_value=True),
    )
    span = ProtoSpan(
        trace_id=b"\x0a" * 16,
        span_id=b"\x0b" * 8,
        parent_span_id=b"\x0c" * 8,
        name="values",
        kind=ProtoSpan.SPAN_KIND_PRODUCER,
        attributes=[
            kv("str", s),
            kv("int", i),
            kv("double", d),
            kv("bool", b),
            kv("bytes", AnyValue(bytes_value=b"\x00\xff")),
            kv("ints", array(i, AnyValue(int_value=4))),
            kv("empty", array()),
            kv("mixed", array(s, i)),
            kv("nested", array(array(i))),
            kv("kv", AnyValue(kvlist_value=KeyValueList(values=[kv("a", i), kv("b", array(s, b))]))),
            kv("unset", AnyValue()),
        ],
    )
    resource = ProtoResource(attributes=[kv(semconv.ROLLOUT_ID, AnyValue(string_value="ro-r"))])
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=[span])])]
    )
    (converted,), rejected = spans_from_otlp(request, attempt_id="at-1")
    assert rejected == []
    assert converted.rollout_id == "ro-r" and converted.parent_id == "0c" * 8 and converted.kind == "PRODUCER"
    attrs = converted.attributes
    assert (attrs["str"], attrs["int"], attrs["double"], attrs["bool"]) == ("x", 3, 0.5, True)
    assert attrs["bytes"] == "00ff"
    assert attrs["ints"] == [3, 4] and attrs["empty"] == []
    assert json.loads(str(attrs["mixed"])) == ["x", 3]
    assert json.loads(str(attrs["nested"])) == [[3]]
    assert json.loads(str(attrs["kv"])) == {"a": 3, "b": ["x", True]}
    assert "unset" not in attrs


def test_otlp_garbage_bytes_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a serialized OTLP ExportTraceServiceRequest"):
        spans_from_otlp(b"\xff\xff\xff not protobuf")


def test_a_nan_or_infinity_from_the_agent_is_kept_as_text_not_lost_with_its_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store refuses NaN/Infinity (JSON has none); the agent's span converts with those values as text."""
    import math

    from agentlightning.store._finite import span_has_nonfinite

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span(
        "tool", attributes={"score": math.nan, "logprobs": (-0.5, -math.inf), "ok": 1.5}
    ) as span:
        span.add_event("step", {"value": math.inf})
    (finished,) = exporter.get_finished_spans()
    provider.shutdown()
    with caplog.at_level("WARNING", logger="agentlightning.otel"):
        converted = span_from_readable(finished, rollout_id="ro-1", attempt_id="at-1")
    assert converted.attributes["score"] == "NaN" and converted.attributes["logprobs"] == "[-0.5, -Infinity]"
    assert converted.attributes["ok"] == 1.5 and converted.events[0].attributes["value"] == "Infinity"
    assert "'score' holds NaN/Infinity" in caplog.text

    assert not span_has_nonfinite(converted)  # what every store checks before it writes a batch
