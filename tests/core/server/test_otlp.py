"""OTLP/HTTP ingest: the stock OpenTelemetry exporter sends spans (plain and gzip) that land in the store intact."""

from __future__ import annotations

import gzip

import httpx
import orjson
import pytest
from google.rpc import status_pb2  # googleapis-common-protos comes with the OTLP exporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlightning import semconv
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from tests.core.server.conftest import MAX_SPANS


async def _attempt(store: InMemoryLightningStore) -> tuple[str, str]:
    await store.enqueue_rollout({"task": 1})
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def _record_spans(resource_attributes: dict[str, str], count: int = 2) -> list[ReadableSpan]:
    """A parent with children, recorded by the real SDK."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource_attributes))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("invoke_agent planner") as parent:
        parent.set_attribute(semconv.GEN_AI_OPERATION_NAME, semconv.OP_INVOKE_AGENT)
        for i in range(count - 1):
            with tracer.start_as_current_span(f"chat m{i}") as child:
                child.set_attribute(semconv.GEN_AI_OPERATION_NAME, semconv.OP_CHAT)
                child.set_attribute(semconv.PROMPT_TOKEN_IDS, [1, 2, 3])
                child.set_attribute(semconv.GEN_AI_USAGE_INPUT_TOKENS, 3)
                child.add_event("delta", {"k": "v"})
    provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
async def test_stock_exporter_spans_land_intact(
    store: InMemoryLightningStore, server: StoreServer, compression: Compression
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    recorded = _record_spans({semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id}, count=3)
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", compression=compression, timeout=10)
    try:
        assert exporter.export(recorded) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    stored = {s.span_id: s for s in await store.query_spans(rollout_id)}
    assert len(stored) == 3
    for original in recorded:
        context = original.get_span_context()
        assert context is not None
        span = stored[f"{context.span_id:016x}"]
        assert span.trace_id == f"{context.trace_id:032x}"
        assert span.attempt_id == attempt_id
        assert span.parent_id == (f"{original.parent.span_id:016x}" if original.parent else None)
        assert span.name == original.name
        for key, value in (original.attributes or {}).items():
            assert span.attributes[key] == (list(value) if isinstance(value, tuple) else value)
        assert span.start_time == original.start_time and span.end_time == original.end_time
    child = next(s for s in stored.values() if s.name == "chat m0")
    assert child.events[0].name == "delta" and child.events[0].attributes == {"k": "v"}
    assert child.resource[semconv.ROLLOUT_ID] == rollout_id


async def test_headers_attribute_spans_without_resource_ids(store: InMemoryLightningStore, server: StoreServer) -> None:
    rollout_id, attempt_id = await _attempt(store)
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces",
        headers={semconv.HEADER_ROLLOUT_ID: rollout_id, semconv.HEADER_ATTEMPT_ID: attempt_id},
    )
    try:
        assert exporter.export(_record_spans({})) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert len(await store.query_spans(rollout_id, attempt_id)) == 2


def _export_request(spans: list[ReadableSpan]) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans).SerializeToString()


async def test_partial_success_for_spans_lacking_ids(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _attempt(store)
    good = _record_spans({semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id})
    anonymous = _record_spans({}, count=3)
    unknown = _record_spans({semconv.ROLLOUT_ID: "ro-ghost", semconv.ATTEMPT_ID: "at-ghost"}, count=1)
    response = await api.post(
        "/v1/traces",
        content=_export_request([*good, *anonymous, *unknown]),
        headers={"content-type": "application/x-protobuf"},
    )
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 4
    assert semconv.ROLLOUT_ID in answer.partial_success.error_message
    assert "ro-ghost" in answer.partial_success.error_message
    assert len(await store.query_spans(rollout_id)) == 2


async def test_json_export(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _attempt(store)
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": rollout_id}},
                        {"key": semconv.ATTEMPT_ID, "value": {"stringValue": attempt_id}},
                    ]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "eee19b7ec3c1b173",
                                "name": "chat",
                                "kind": 3,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "7"}}],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    response = await api.post("/v1/traces", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "partialSuccess" not in response.json() or not response.json()["partialSuccess"].get("rejectedSpans")
    (span,) = await store.query_spans(rollout_id)
    assert span.span_id == "eee19b7ec3c1b174" and span.parent_id == "eee19b7ec3c1b173"
    assert span.kind == "CLIENT" and span.attributes["gen_ai.usage.input_tokens"] == 7


@pytest.mark.parametrize(
    ("content", "headers", "status", "words"),
    [
        (b"\xff\xfe garbage", {"content-type": "application/x-protobuf"}, 400, "protobuf"),
        (b"not gzip", {"content-type": "application/x-protobuf", "content-encoding": "gzip"}, 400, "gzip"),
        (b"{}", {"content-type": "text/plain"}, 415, "application/x-protobuf"),
        (b"{bad", {"content-type": "application/json"}, 400, "JSON"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', {}, 400, "hex"),
    ],
)
async def test_bad_exports_are_4xx_with_status_message(
    api: httpx.AsyncClient,
    store: InMemoryLightningStore,
    content: bytes,
    headers: dict[str, str],
    status: int,
    words: str,
) -> None:
    headers = headers or {"content-type": "application/json"}
    response = await api.post("/v1/traces", content=content, headers=headers)
    assert response.status_code == status
    if response.headers["content-type"] == "application/json":
        message = orjson.loads(response.content)["message"]
    else:
        message = status_pb2.Status.FromString(response.content).message
    assert words in message
    assert (await store.statistics()).total_spans == 0


async def test_export_limits(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _attempt(store)
    ids = {semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id}
    too_many = _export_request(_record_spans(ids, count=MAX_SPANS + 1))
    response = await api.post("/v1/traces", content=too_many, headers={"content-type": "application/x-protobuf"})
    assert response.status_code == 413
    assert f"at most {MAX_SPANS}" in status_pb2.Status.FromString(response.content).message
    # A small gzip body that inflates past max_body_bytes (a decompression bomb) is refused after inflating a bit.
    bomb = ExportTraceServiceRequest()
    bomb.resource_spans.add().resource.attributes.add(key="pad").value.string_value = "x" * 200_000
    response = await api.post(
        "/v1/traces",
        content=gzip.compress(bomb.SerializeToString()),
        headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
    )
    assert response.status_code == 413
    assert "decompressed request body" in status_pb2.Status.FromString(response.content).message
    assert (await store.statistics()).total_spans == 0


async def test_the_spec_documents_the_errors_the_route_answers(api: httpx.AsyncClient) -> None:
    spec = (await api.get("/openapi.json")).json()
    responses = spec["paths"]["/v1/traces"]["post"]["responses"]
    # google.rpc.Status for the route's own refusals (not the store's ErrorBody), and no 404/409/422 it never sends.
    assert sorted(responses) == ["200", "400", "401", "403", "413", "415"]
    status_ref = {"$ref": "#/components/schemas/GoogleRpcStatus"}
    for code in ("400", "415"):
        assert responses[code]["content"]["application/json"]["schema"] == status_ref
        assert responses[code]["content"]["application/x-protobuf"]["schema"]["format"] == "binary"
    assert status_ref in responses["413"]["content"]["application/json"]["schema"]["oneOf"]
    schema = spec["components"]["schemas"]["GoogleRpcStatus"]
    # What the route sends matches what the spec says it sends.
    bad = await api.post("/v1/traces", content=b"{", headers={"content-type": "application/json"})
    json_brotli = {"content-type": "application/json", "content-encoding": "br"}
    unknown = await api.post("/v1/traces", content=b"x", headers=json_brotli)
    for answer, code in ((bad, 400), (unknown, 415)):
        assert answer.status_code == code
        body = answer.json()
        assert sorted(body) == sorted(schema["required"]) and isinstance(body["code"], int)
