"""The lean tracer behind LightningTracer records exactly what the OpenTelemetry SDK records, and works as a provider.

Each scenario runs twice, through ``LightningTracer`` on its own (lean) provider and on an SDK ``TracerProvider``
with the same resource and limits, and the delivered spans must be equal (ids and clock times aside, which are
compared structurally: parents and links by span name).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import context as context_api, trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from agentlightning import semconv
from agentlightning._lean_tracer import LeanSpan, LeanTracerProvider
from agentlightning.otel import clean_attribute_value, span_from_readable, spans_from_otlp
from agentlightning.tracing import LightningTracer, ListSpanSink, rollout_context
from agentlightning.types import Span

TOKEN_IDS = list(range(32))
ATTRIBUTES: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.usage.input_tokens": 120,
    "temperature": 0.5,
    "stream": False,
    "agentlightning.prompt_token_ids": TOKEN_IDS,
    "agentlightning.response_token_ids": (7, 8, 9),
    "logprobs": [-0.5, -1.25],
    "stops": ["\n", "END"],
    "flags": [True, False],
    "empty": [],
}
# Values outside our model: the SDK keeps them and the conversion normalises them; the lean tracer must agree.
ODD_ATTRIBUTES: dict[str, Any] = {
    "none": None,
    "bytes": b"abc",
    "mapping": {"a": 1, "b": [1, 2]},
    "mixed": [1, "a"],
    "numbers": [1, 2.5],
    "with_none": [1, None],
}


class Boom(Exception):
    pass


def _raise_boom() -> None:
    raise Boom("boom")


def scenario(otel: Tracer) -> None:
    """Everything an instrumentation may do with the API, with fixed times wherever the API takes one."""
    with otel.start_as_current_span("root", attributes=ATTRIBUTES, start_time=1_000) as root:
        root.set_attribute("late", "value")
        root.set_attribute("gen_ai.operation.name", "chat-again")  # a key set again moves to the end
        root.set_attributes({"more": 1, "odd": b"\xff\xfe"})
        root.add_event("thinking", {"step": 2, "tags": ("x", "y")}, timestamp=1_500)
        root.update_name("root renamed")
        with otel.start_as_current_span("child", kind=SpanKind.CLIENT, attributes=ODD_ATTRIBUTES) as child:
            child.set_status(Status(StatusCode.OK))
            child.set_status(Status(StatusCode.ERROR, "ignored: OK is final"))
        with pytest.raises(Boom), otel.start_as_current_span("failing", start_time=2_000):
            _raise_boom()
        quiet = otel.start_span("quiet", record_exception=False, set_status_on_exception=False, start_time=3_000)
        with pytest.raises(Boom), quiet:
            _raise_boom()
        with pytest.raises(Boom), otel.start_span("escaped", start_time=4_000):
            _raise_boom()
        manual = otel.start_span(
            "manual",
            links=[Link(root.get_span_context(), {"why": "retry"})],
            start_time=5_000,
        )
        manual.add_link(child.get_span_context(), {"why": "after"})
        manual.set_status(StatusCode.ERROR, "by code")
        manual.record_exception(ValueError("noted"), {"extra": 1}, timestamp=5_500)
        manual.end(end_time=6_000)
        manual.set_attribute("after-end", 1)  # ignored, with a warning
        manual.end()  # ignored, with a warning
        # an explicit context: a root span although "root" is current
        with otel.start_as_current_span("detached", context=context_api.Context(), start_time=7_000):
            pass
        # a sampled remote parent (as from a traceparent header) is followed
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        with otel.start_as_current_span("remote child", trace_api.set_span_in_context(NonRecordingSpan(remote))):
            pass
        # an unsampled parent makes a non-recording span, which is not delivered
        unsampled = SpanContext(0xABC, 0x123, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT))
        with otel.start_as_current_span("dropped", trace_api.set_span_in_context(NonRecordingSpan(unsampled))) as d:
            assert not d.is_recording()


def _record(lean: bool, run: Callable[[Tracer], None] = scenario, *, dropped: int = 0) -> list[Span]:
    sink = ListSpanSink()
    resource = Resource.create({"service.name": "agentlightning"})
    provider = None if lean else TracerProvider(resource=resource)
    tracer = LightningTracer(sink, provider=provider)
    assert isinstance(tracer.provider, LeanTracerProvider if lean else TracerProvider)
    with rollout_context("ro-1", "at-1"):
        run(tracer.get_tracer("test"))
    assert tracer.flush(10)
    tracer.shutdown()
    if provider is not None:
        provider.shutdown()
    assert tracer.dropped_spans == dropped
    return sink.spans


def _comparable(spans: list[Span]) -> dict[str, dict[str, Any]]:
    """Spans by name, with ids replaced by span names and clock times by whether they were given."""
    names = {span.span_id: span.name for span in spans}
    result: dict[str, dict[str, Any]] = {}
    for span in spans:
        data = span.model_dump()
        for key in ("span_id", "trace_id"):
            del data[key]
        remote = f"{0xDEF:016x}"  # the remote parent's id is fixed; other parents not delivered are random
        data["parent_id"] = (
            names.get(span.parent_id, span.parent_id if span.parent_id == remote else "elsewhere")
            if span.parent_id
            else None
        )
        data["same_trace_as_parent"] = span.parent_id in names and any(
            other.span_id == span.parent_id and other.trace_id == span.trace_id for other in spans
        )
        data["start_time"] = span.start_time if span.start_time < 10**6 else "now"
        data["end_time"] = span.end_time if span.end_time is not None and span.end_time < 10**6 else "now"
        for event in data["events"]:
            stack = event["attributes"].pop("exception.stacktrace", None)
            assert stack is None or "_raise_boom" in stack or "ValueError: noted" in stack or len(stack) <= 2
            event["timestamp"] = event["timestamp"] if event["timestamp"] < 10**6 else "now"
        for link in data["links"]:
            link["span_id"] = names.get(link["span_id"], "elsewhere")
            del link["trace_id"]
        result[span.name] = data
    return result


def test_lean_spans_equal_sdk_spans() -> None:
    lean, sdk = _record(lean=True), _record(lean=False)
    assert _comparable(lean) == _comparable(sdk)
    spans = _comparable(lean)
    assert set(spans) == {
        "root renamed",
        "child",
        "failing",
        "quiet",
        "escaped",
        "manual",
        "detached",
        "remote child",
    }
    root = spans["root renamed"]
    assert root["attributes"]["agentlightning.prompt_token_ids"] == TOKEN_IDS
    assert root["attributes"]["agentlightning.response_token_ids"] == [7, 8, 9]
    assert list(root["attributes"])[-5:] == [
        semconv.ATTEMPT_ID,
        "late",
        "gen_ai.operation.name",
        "more",
        "odd",
    ]
    assert spans["child"]["parent_id"] == "root renamed" and spans["child"]["same_trace_as_parent"]
    assert spans["child"]["status"] == {"code": "OK", "message": None}
    assert spans["child"]["attributes"]["mapping"] == '{"a":1,"b":[1,2]}'
    assert spans["failing"]["status"] == {"code": "ERROR", "message": "Boom: boom"}
    assert spans["escaped"]["events"][0]["attributes"]["exception.escaped"] == "True"
    assert spans["quiet"]["events"] == [] and spans["quiet"]["status"]["code"] == "UNSET"
    assert spans["manual"]["end_time"] == 6_000 and "after-end" not in spans["manual"]["attributes"]
    assert [link["span_id"] for link in spans["manual"]["links"]] == ["root renamed", "child"]
    assert spans["detached"]["parent_id"] is None
    assert spans["remote child"]["parent_id"] == f"{0xDEF:016x}"
    by_name = {span.name: span for span in lean}
    assert by_name["remote child"].trace_id == f"{0xABC:032x}"
    for span in lean:  # built without validation, yet exactly what validation gives
        assert Span.model_validate_json(span.model_dump_json()) == span


@pytest.mark.parametrize(
    "limits",
    [
        {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "3", "OTEL_SPAN_EVENT_COUNT_LIMIT": "1"},
        {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "2", "OTEL_SPAN_LINK_COUNT_LIMIT": "0"},
    ],
)
def test_lean_spans_honour_the_sdks_span_limits(monkeypatch: pytest.MonkeyPatch, limits: dict[str, str]) -> None:
    for name, value in limits.items():
        monkeypatch.setenv(name, value)
    # With 3 attributes at most, the rollout id stamped on "root" is pushed out by later ones: the span cannot be
    # stored (the same with the SDK).
    dropped = 1 if "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in limits else 0
    lean, sdk = _record(lean=True, dropped=dropped), _record(lean=False, dropped=dropped)
    assert _comparable(lean) == _comparable(sdk)
    assert len(lean) == 8 - dropped


@pytest.mark.parametrize(
    ("variable", "value", "lean"),
    [
        ("OTEL_TRACES_SAMPLER", "always_off", False),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_on", True),
        ("OTEL_SDK_DISABLED", "true", False),
        ("OTEL_SDK_DISABLED", "false", True),
    ],
)
def test_sdk_only_settings_fall_back_to_the_sdk(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, lean: bool
) -> None:
    monkeypatch.setenv(variable, value)
    tracer = LightningTracer(ListSpanSink())
    try:
        assert isinstance(tracer.provider, LeanTracerProvider if lean else TracerProvider)
    finally:
        tracer.shutdown()


@pytest.fixture
def lean_tracer() -> Iterator[tuple[LightningTracer, ListSpanSink]]:
    sink = ListSpanSink()
    tracer = LightningTracer(sink, export_interval_s=0.05)
    yield tracer, sink
    tracer.shutdown()


def test_lean_provider_serves_third_party_instrumentations_and_processors(
    lean_tracer: tuple[LightningTracer, ListSpanSink],
) -> None:
    tracer, sink = lean_tracer
    provider = tracer.provider
    assert isinstance(provider, LeanTracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # e.g. the user's own OTLP exporter
    # An instrumentation asks the API for a tracer with its own scope, version and schema.
    third_party = trace_api.get_tracer("some.instrumentation", "1.2.3", tracer_provider=provider)
    assert third_party is trace_api.get_tracer("some.instrumentation", "1.2.3", tracer_provider=provider)

    @third_party.start_as_current_span("sync work")
    def work() -> int:
        return 1

    @third_party.start_as_current_span("async work")
    async def async_work() -> int:
        await asyncio.sleep(0)
        return 2

    with rollout_context("ro-1", "at-1"):
        with third_party.start_as_current_span("request", kind=SpanKind.SERVER) as request:
            assert trace_api.get_current_span() is request
            assert work() == 1
            assert asyncio.run(async_work()) == 2
            inner = third_party.start_span("used")
            with trace_api.use_span(inner, end_on_exit=True):
                assert trace_api.get_current_span() is inner
        assert trace_api.get_current_span() is trace_api.INVALID_SPAN
    assert tracer.flush(10)

    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == ["sync work", "async work", "used", "request"]
    assert all(isinstance(s, LeanSpan) for s in finished)
    scope = finished[0].instrumentation_scope
    assert scope is not None and (scope.name, scope.version) == ("some.instrumentation", "1.2.3")
    ours = {s.name: s for s in sink.spans}
    assert set(ours) == {"sync work", "async work", "used", "request"}
    assert {s.parent_id for n, s in ours.items() if n != "request"} == {ours["request"].span_id}
    # Exporters that speak OTLP read lean spans like SDK spans, and the ingest path agrees with the direct one.
    converted, rejected = spans_from_otlp(encode_spans(finished))
    assert rejected == []
    for span in converted:
        span.attributes.pop(semconv.SPAN_SOURCE)
        assert span == ours[span.name]
    assert provider.force_flush()


def test_lean_span_api_details(lean_tracer: tuple[LightningTracer, ListSpanSink]) -> None:
    tracer, sink = lean_tracer
    otel = tracer.get_tracer("t")
    with rollout_context("ro-1", "at-1"):
        span = otel.start_span("s", attributes={"k": [1, 2]})
        assert isinstance(span, LeanSpan) and isinstance(span, ReadableSpan)
        assert span.is_recording() and span.get_span_context().is_valid
        assert span.get_span_context().trace_flags.sampled
        assert span.attributes is not None and span.attributes["k"] == (1, 2)  # stored as the SDK stores them
        span.set_attribute("", "empty key is dropped")
        span.set_attribute("none", None)
        span.end()
        assert not span.is_recording()
    assert tracer.flush(10)
    (stored,) = sink.spans
    assert stored.attributes == {"k": [1, 2], semconv.ROLLOUT_ID: "ro-1", semconv.ATTEMPT_ID: "at-1"}
    assert span_from_readable(span) == stored


def test_shared_provider_shutdown_is_once_and_stops_delivery(lean_tracer: tuple[LightningTracer, ListSpanSink]) -> None:
    tracer, sink = lean_tracer
    provider = tracer.provider
    assert isinstance(provider, LeanTracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer.shutdown()
    provider.shutdown()  # already shut down with the tracer: no error, nothing twice
    with rollout_context("ro-1", "at-1"), tracer.get_tracer("t").start_as_current_span("late"):
        pass
    assert sink.spans == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("text", "text"),
        (3, 3),
        (True, True),
        (0.5, 0.5),
        ([1, 2], (1, 2)),
        ((1, 2), (1, 2)),
        ([], ()),
        (["a", "b"], ("a", "b")),
        ([True, False], (True, False)),
        ([1, 2.5], (1.0, 2.5)),
        ([1, "a"], '[1,"a"]'),
        ([1, None], "[1,null]"),
        ({"a": (1, 2)}, '{"a":[1,2]}'),
        (b"abc", "abc"),
        (b"\xff", "ff"),
        (None, None),
        (StatusCode.OK, "StatusCode.OK"),
    ],
)
def test_clean_attribute_value(value: object, expected: object) -> None:
    cleaned = clean_attribute_value(value)
    assert cleaned == expected and type(cleaned) is type(expected)


class Source(str, enum.Enum):  # noqa: UP042  # the old-style str enum, whose str() is not its value
    HOOK = "hook"


class Level(enum.IntEnum):
    HIGH = 3


def test_clean_attribute_value_cuts_strings_and_keeps_base_types() -> None:
    assert clean_attribute_value("abcdef", 3) == "abc"
    assert clean_attribute_value(["abcdef", "xy"], 3) == ("abc", "xy")
    for value, expected in ((Source.HOOK, "hook"), (Level.HIGH, 3), ([Source.HOOK], ("hook",))):
        cleaned = clean_attribute_value(value)
        assert cleaned == expected and type(cleaned) is type(expected)


def test_spans_are_built_the_fast_way_on_this_pydantic() -> None:
    # otel.py builds spans without pydantic's per-field loop when that gives the same model; a pydantic release
    # with another model layout falls back to model_construct (correct, slower): this says which one is in use.
    from agentlightning import otel

    assert otel._fast_construct_works()  # pyright: ignore[reportPrivateUsage]  # the check itself is under test
