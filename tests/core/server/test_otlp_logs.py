"""OTLP/HTTP log ingest (POST /v1/logs): the stock log exporter's records land as spans; bad exports are 4xx."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import orjson
import pytest
from google.rpc import status_pb2  # googleapis-common-protos comes with the OTLP exporter
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from agentlightning import semconv
from agentlightning.conventions import LOG_BODY, LOG_EVENT_NAME, LOG_SOURCE
from agentlightning.server import StoreServer, create_app
from agentlightning.store.memory import InMemoryLightningStore
from tests.core.server.conftest import MAX_SPANS, TOKEN

PROTOBUF = {"content-type": "application/x-protobuf"}


async def _attempt(store: InMemoryLightningStore) -> tuple[str, str]:
    await store.enqueue_rollout({"task": 1})
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.start_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def _record_logs(resource_attributes: dict[str, str], count: int = 2) -> tuple[list[ReadableLogRecord], str]:
    """``count`` GenAI message events inside a span, recorded by the real SDK; (records, the span's id)."""
    memory = InMemoryLogRecordExporter()
    logs = LoggerProvider(resource=Resource.create(resource_attributes))
    logs.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = logs.get_logger("test-genai")
    with TracerProvider().get_tracer("t").start_as_current_span("chat m") as span:
        for i in range(count):
            logger.emit(
                event_name="gen_ai.user.message",
                body={"content": f"hello {i}", "n": i},
                attributes={"gen_ai.system": "openai"},
            )
    logs.shutdown()
    return list(memory.get_finished_logs()), f"{span.get_span_context().span_id:016x}"


def _export_request(records: list[ReadableLogRecord]) -> bytes:
    return encode_logs(records).SerializeToString()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
async def test_stock_log_exporter_records_land_as_spans(
    store: InMemoryLightningStore, server: StoreServer, compression: Compression
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    records, span_id = _record_logs({semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id})
    exporter = OTLPLogExporter(endpoint=f"{server.url}/v1/logs", compression=compression, timeout=10)
    try:
        assert exporter.export(records) == LogRecordExportResult.SUCCESS
        # An exporter's retry of the same batch stores nothing twice (the span ids are derived from the records).
        assert exporter.export(records) == LogRecordExportResult.SUCCESS
    finally:
        exporter.shutdown()
    stored = await store.query_spans(rollout_id, attempt_id)
    assert len(stored) == 2 and len({s.span_id for s in stored}) == 2
    for index, span in enumerate(stored):
        assert span.parent_id == span_id and span.name == "gen_ai.user.message"
        assert span.attributes[semconv.SPAN_SOURCE] == LOG_SOURCE
        assert span.attributes[LOG_EVENT_NAME] == "gen_ai.user.message"
        assert json.loads(str(span.attributes[LOG_BODY])) == {"content": f"hello {index}", "n": index}
        assert span.attributes["gen_ai.system"] == "openai"
        assert span.resource[semconv.ROLLOUT_ID] == rollout_id
        assert span.start_time == span.end_time and span.start_time > 0


async def test_headers_attribute_records_and_partial_success(
    api: httpx.AsyncClient, store: InMemoryLightningStore
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    good, _ = _record_logs({})
    headers = {**PROTOBUF, semconv.HEADER_ROLLOUT_ID: rollout_id, semconv.HEADER_ATTEMPT_ID: attempt_id}
    response = await api.post("/v1/logs", content=_export_request(good), headers=headers)
    assert response.status_code == 200
    assert not ExportLogsServiceResponse.FromString(response.content).partial_success.rejected_log_records
    anonymous, _ = _record_logs({}, count=3)
    unknown, _ = _record_logs({semconv.ROLLOUT_ID: "ro-ghost", semconv.ATTEMPT_ID: "at-ghost"}, count=1)
    malformed = encode_logs(good[:1])
    malformed.resource_logs[0].resource.attributes.add(key=semconv.ROLLOUT_ID).value.string_value = rollout_id
    malformed.resource_logs[0].resource.attributes.add(key=semconv.ATTEMPT_ID).value.string_value = attempt_id
    malformed.resource_logs[0].scope_logs[0].log_records[0].span_id = b"\x01\x02"
    body = encode_logs([*anonymous, *unknown])
    body.resource_logs.extend(malformed.resource_logs)
    response = await api.post("/v1/logs", content=body.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    answer = ExportLogsServiceResponse.FromString(response.content).partial_success
    assert answer.rejected_log_records == 5
    for words in (semconv.ROLLOUT_ID, "ro-ghost", "malformed id"):
        assert words in answer.error_message
    assert len(await store.query_spans(rollout_id)) == 2


async def test_json_export_and_records_without_a_span(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _attempt(store)
    ids = [
        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": rollout_id}},
        {"key": semconv.ATTEMPT_ID, "value": {"stringValue": attempt_id}},
    ]
    record: dict[str, Any] = {
        "timeUnixNano": "1544712660000000000",
        "eventName": "gen_ai.choice",
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "body": {"kvlistValue": {"values": [{"key": "index", "value": {"intValue": "0"}}]}},
        "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}}],
    }
    orphan = {"observedTimeUnixNano": "1544712661000000000", "body": {"stringValue": "plain text"}}
    body = {"resourceLogs": [{"resource": {"attributes": ids}, "scopeLogs": [{"logRecords": [record, orphan]}]}]}
    response = await api.post("/v1/logs", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert not response.json().get("partialSuccess", {}).get("rejectedLogRecords")
    choice, text = await store.query_spans(rollout_id)
    assert (choice.trace_id, choice.parent_id, choice.name) == (
        "5b8efff798038103d269b633813fc60c",
        "eee19b7ec3c1b174",
        "gen_ai.choice",
    )
    assert json.loads(str(choice.attributes[LOG_BODY])) == {"index": 0}
    assert choice.start_time == 1544712660000000000
    # A record outside any span is kept too: no parent, a synthetic trace id, the observed time.
    assert text.parent_id is None and len(text.trace_id) == 32 and text.name == "log record"
    assert text.attributes[LOG_BODY] == '"plain text"' and text.start_time == 1544712661000000000


@pytest.mark.parametrize(
    ("content", "headers", "status", "words"),
    [
        (b"\xff\xfe garbage", PROTOBUF, 400, "protobuf"),
        (b"not gzip", {**PROTOBUF, "content-encoding": "gzip"}, 400, "gzip"),
        (b"{}", {"content-type": "text/plain"}, 415, "application/x-protobuf"),
        (b"x", {"content-type": "application/json", "content-encoding": "br"}, 415, "content-encoding"),
        (b"{bad", {}, 400, "JSON"),
        (b"[1]", {}, 400, "ExportLogsServiceRequest JSON object"),
        (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"spanId": "zz"}]}]}]}', {}, 400, "hex"),
        (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": 3}]}]}]}', {}, 400, "ExportLogsServiceRequest"),
    ],
)
async def test_bad_log_exports_are_4xx_with_status_message(
    api: httpx.AsyncClient,
    store: InMemoryLightningStore,
    content: bytes,
    headers: dict[str, str],
    status: int,
    words: str,
) -> None:
    headers = headers or {"content-type": "application/json"}
    response = await api.post("/v1/logs", content=content, headers=headers)
    assert response.status_code == status
    if response.headers["content-type"] == "application/json":
        message = orjson.loads(response.content)["message"]
    else:
        message = status_pb2.Status.FromString(response.content).message
    assert words in message
    assert (await store.statistics()).total_spans == 0


async def test_log_export_limits_and_nonfinite(api: httpx.AsyncClient, store: InMemoryLightningStore) -> None:
    rollout_id, attempt_id = await _attempt(store)
    ids = {semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id}
    too_many, _ = _record_logs(ids, count=MAX_SPANS + 1)
    response = await api.post("/v1/logs", content=_export_request(too_many), headers=PROTOBUF)
    assert response.status_code == 413
    assert f"at most {MAX_SPANS}" in status_pb2.Status.FromString(response.content).message
    bomb = ExportLogsServiceRequest()
    bomb.resource_logs.add().resource.attributes.add(key="pad").value.string_value = "x" * 200_000
    gzipped = {**PROTOBUF, "content-encoding": "gzip"}
    response = await api.post("/v1/logs", content=gzip.compress(bomb.SerializeToString()), headers=gzipped)
    assert response.status_code == 413
    assert "decompressed request body" in status_pb2.Status.FromString(response.content).message
    nan = encode_logs(_record_logs(ids, count=1)[0])
    nan.resource_logs[0].scope_logs[0].log_records[0].attributes.add(key="score").value.double_value = float("nan")
    response = await api.post("/v1/logs", content=nan.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 400
    assert "score" in status_pb2.Status.FromString(response.content).message
    assert (await store.statistics()).total_spans == 0


async def test_logs_need_the_token_like_every_route(store: InMemoryLightningStore) -> None:
    app = create_app(store, token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://store") as api:
        missing = await api.post("/v1/logs", content=b"", headers=PROTOBUF)
        assert missing.status_code == 401
        right = await api.post("/v1/logs", content=b"", headers={**PROTOBUF, "authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200  # an empty export is a valid one


async def test_the_spec_documents_the_logs_route(api: httpx.AsyncClient) -> None:
    spec = (await api.get("/openapi.json")).json()
    post = spec["paths"]["/v1/logs"]["post"]
    assert sorted(post["responses"]) == ["200", "400", "401", "403", "413", "415"]
    assert set(post["requestBody"]["content"]) == {"application/x-protobuf", "application/json"}
    assert "otlp-log" in post["description"] and "log records" in post["responses"]["413"]["description"]
    status_ref = {"$ref": "#/components/schemas/GoogleRpcStatus"}
    assert post["responses"]["400"]["content"]["application/json"]["schema"] == status_ref
    # The traces route keeps its own wording.
    assert "more spans" in spec["paths"]["/v1/traces"]["post"]["responses"]["413"]["description"]
