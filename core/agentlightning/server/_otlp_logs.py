"""OTLP/HTTP log ingest (``POST /v1/logs``): GenAI message events that instrumentations send as log records.

opentelemetry-instrumentation-openai-v2 (and other GenAI semconv instrumentations) can send a call's messages as
OTLP log records rather than span attributes: one ``gen_ai.{role}.message`` record per request message and one
``gen_ai.choice`` per choice (default mode, ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``), or one
``gen_ai.client.inference.operation.details`` record whose attributes hold ``gen_ai.input.messages`` and friends
(``gen_ai_latest_experimental`` with ``EVENT_ONLY`` or ``SPAN_AND_EVENT``). Each record names its span by
trace/span id.

Each record is stored as it came, as a span of its own (``agentlightning.span.source = otlp-log``, parent = the
record's span), and the adapter folds the records into their span when it reads the attempt
(:func:`agentlightning.conventions.apply_conventions`). Why on read: stored spans are immutable (``add_spans`` is
idempotent on the span id), and records may arrive before or after their span (logs and traces are exported by
separate batch processors); folding on read needs neither an update path nor a buffer that a restart would lose.

The route speaks OTLP/HTTP like ``POST /v1/traces``: protobuf or JSON, optional gzip, google.rpc.Status refusals,
rollout/attempt ids from the headers, else the record's or resource's attributes; ``partial_success`` names the
records rejected (no ids, unknown attempt, malformed trace or span id).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any, Final, cast

from fastapi import FastAPI
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from starlette.responses import Response

from agentlightning import semconv
from agentlightning.conventions import LOG_BODY, LOG_EVENT_NAME, LOG_SOURCE
from agentlightning.otel import plain_any_value
from agentlightning.server._middleware import StoreMetrics
from agentlightning.server._otlp import OTLP_REQUEST_BODY, OtlpSignal, document_status_errors, export_handler
from agentlightning.store.base import LightningStore
from agentlightning.types import Attributes, AttributeValue, Span

logger = logging.getLogger("agentlightning.server.otlp")

_LOG_CONTAINERS: Final = ("resourceLogs", "scopeLogs", "logRecords")
_SEVERITY_TEXT: Final = "agentlightning.log.severity_text"
_SEVERITY_NUMBER: Final = "agentlightning.log.severity_number"
_SCOPE: Final = "agentlightning.log.scope"
_UNNAMED: Final = "log record"


def _count_log_records(export: ExportLogsServiceRequest) -> int:
    return sum(len(scope.log_records) for rl in export.resource_logs for scope in rl.scope_logs)


def _set_rejected_log_records(answer: Any, rejected: int) -> None:
    answer.partial_success.rejected_log_records = rejected


def add_otlp_logs_route(
    app: FastAPI, store: LightningStore, *, metrics: StoreMetrics, max_body_bytes: int, max_records: int
) -> None:
    """Mount ``POST /v1/logs`` on ``app``; ``max_records`` bounds the log records of one export."""
    logs = OtlpSignal(
        request_type=ExportLogsServiceRequest,
        json_containers=_LOG_CONTAINERS,
        count=_count_log_records,
        to_spans=spans_from_otlp_logs,
        new_answer=ExportLogsServiceResponse,
        set_rejected=_set_rejected_log_records,
        noun="log records",
        metrics_source="otlp-logs",
        batch_size_env="OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
    )
    export_logs = export_handler(logs, store, metrics=metrics, max_body_bytes=max_body_bytes, max_items=max_records)

    app.add_api_route(
        "/v1/logs",
        export_logs,
        methods=["POST"],
        tags=["otlp"],
        summary="OTLP/HTTP log export",
        description=(
            "OTLP/HTTP logs (protobuf or JSON, optional gzip). Each log record is stored as a span of its attempt "
            "(`agentlightning.span.source = otlp-log`, parent = the record's span id, name = its event name); the "
            "adapter folds GenAI message events (`gen_ai.*.message`, `gen_ai.choice`, "
            "`gen_ai.client.inference.operation.details`) into their LLM span. Rollout and attempt ids come from "
            "the `x-agentlightning-rollout-id`/`x-agentlightning-attempt-id` headers, else from the record's or "
            "resource's `agentlightning.rollout_id`/`agentlightning.attempt_id` attributes."
        ),
        response_class=Response,
        openapi_extra={
            "requestBody": OTLP_REQUEST_BODY,
            "responses": {
                "200": {"description": "ExportLogsServiceResponse (partial_success lists rejected log records)."},
            },
        },
    )
    document_status_errors(app, "/v1/logs", "log records")


def spans_from_otlp_logs(
    export: ExportLogsServiceRequest, *, rollout_id: str | None = None, attempt_id: str | None = None
) -> tuple[list[Span], list[str]]:
    """The log records of an OTLP log export as spans to store, plus the reasons for records rejected."""
    spans: list[Span] = []
    rejected: list[str] = []
    index = 0
    for resource_logs in export.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope = f"{scope_logs.scope.name} {scope_logs.scope.version}".strip()
            for record in scope_logs.log_records:
                try:
                    spans.append(_span_from_record(record, index, resource, scope, rollout_id, attempt_id))
                except ValueError as exc:
                    rejected.append(str(exc))
                index += 1
    return spans, rejected


def _span_from_record(
    record: LogRecord, index: int, resource: Attributes, scope: str, rollout_id: str | None, attempt_id: str | None
) -> Span:
    attributes = _attributes(record.attributes)
    legacy_name = attributes.get("event.name")  # the Events API before LogRecord.event_name existed
    event_name = record.event_name or (legacy_name if isinstance(legacy_name, str) else "")
    name = event_name or _UNNAMED
    # Deterministic id: an exporter's retry of the same export stores each record once (add_spans is idempotent).
    digest = hashlib.blake2b(record.SerializeToString(deterministic=True), digest_size=24)
    digest.update(index.to_bytes(8, "big"))
    synthetic = digest.hexdigest()
    if len(record.trace_id) not in (0, 16) or len(record.span_id) not in (0, 8):
        raise ValueError(
            f"log record {name!r} #{index} has a malformed id (trace_id {record.trace_id.hex()!r}, span_id "
            f"{record.span_id.hex()!r}); OTLP requires 16-byte trace ids and 8-byte span ids, or none"
        )
    rollout_id = rollout_id or _id_from(attributes, resource, semconv.ROLLOUT_ID)
    attempt_id = attempt_id or _id_from(attributes, resource, semconv.ATTEMPT_ID)
    if rollout_id is None or attempt_id is None:
        missing = [
            key for key, value in ((semconv.ROLLOUT_ID, rollout_id), (semconv.ATTEMPT_ID, attempt_id)) if not value
        ]
        raise ValueError(
            f"log record {name!r} #{index} has no {' or '.join(missing)}: set it as a record or resource attribute, "
            f"or attribute the export through header {semconv.HEADER_ROLLOUT_ID}"
        )
    attributes[semconv.SPAN_SOURCE] = LOG_SOURCE
    if event_name:
        attributes[LOG_EVENT_NAME] = event_name
    if record.HasField("body"):
        attributes[LOG_BODY] = json.dumps(plain_any_value(record.body), separators=(",", ":"), ensure_ascii=False)
    if record.severity_text:
        attributes[_SEVERITY_TEXT] = record.severity_text
    if record.severity_number:
        attributes[_SEVERITY_NUMBER] = int(record.severity_number)
    if scope:
        attributes[_SCOPE] = scope
    has_span = len(record.span_id) == 8 and any(record.span_id)
    when = record.time_unix_nano or record.observed_time_unix_nano
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id=record.trace_id.hex() if len(record.trace_id) == 16 else synthetic[16:48],
        span_id=synthetic[:16],
        parent_id=record.span_id.hex() if has_span else None,
        name=name,
        start_time=when,
        end_time=when,
        attributes=attributes,
        resource=resource,
    )


def _id_from(attributes: Attributes, resource: Attributes, key: str) -> str | None:
    value = attributes.get(key, resource.get(key))
    return value if isinstance(value, str) and value else None


def _attributes(key_values: Sequence[KeyValue]) -> Attributes:
    """OTLP attributes as ours: primitives as they are, homogeneous arrays as lists, anything nested as JSON text."""
    result: Attributes = {}
    for kv in key_values:
        value = plain_any_value(kv.value)
        if value is None:
            continue
        result[kv.key] = _attribute(value)
    return result


def _attribute(value: Any) -> AttributeValue:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list):
        items = cast(list[Any], value)
        kinds: set[type] = {type(item) for item in items}
        if len(kinds) <= 1 and kinds <= {str, bool, int, float}:
            return cast(AttributeValue, items)  # empty, or one primitive type: checked just above
    # Arrays of maps (the details event's gen_ai.input.messages) become the JSON text span attributes carry.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
