"""OTLP/HTTP trace ingest (``POST /v1/traces``): any OpenTelemetry exporter can send spans with no SDK of ours.

Follows https://opentelemetry.io/docs/specs/otlp/#otlphttp: protobuf (``application/x-protobuf``) or JSON
(``application/json``, hex trace/span ids) bodies, optional gzip; 200 with ``partial_success`` naming rejected spans;
4xx bodies are ``google.rpc.Status`` messages. Rollout and attempt ids come from the headers
``x-agentlightning-rollout-id``/``x-agentlightning-attempt-id`` when given (they then apply to every span of the
export), else from the span or resource attributes ``agentlightning.rollout_id``/``agentlightning.attempt_id``.

A double that is NaN or ±Infinity (protobuf carries them; OTLP/JSON writes them as the strings ``"NaN"``,
``"Infinity"``) fails the whole export with 400 naming the span and attribute: the store keeps JSON, which has no
such numbers (issue #26), and a 400 tells the exporter not to retry the same data.
"""

from __future__ import annotations

import base64
import binascii
import logging
import zlib
from collections.abc import Iterator
from typing import Any, Final, cast

import orjson
from fastapi import FastAPI, Request
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.responses import Response

from agentlightning import semconv
from agentlightning.otel import spans_from_otlp
from agentlightning.server._middleware import BodyTooLargeError, StoreMetrics
from agentlightning.store._finite import (
    NO_NONFINITE,
    Location,
    describe_float,
    describe_location,
    nonfinite_in_refused_json,
    nonfinite_span_error,
    span_has_nonfinite,
)
from agentlightning.store.base import LightningStore
from agentlightning.types import Span

logger = logging.getLogger("agentlightning.server.otlp")

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
_MAX_REASONS: Final = 5


class _OtlpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def add_otlp_route(
    app: FastAPI, store: LightningStore, *, metrics: StoreMetrics, max_body_bytes: int, max_spans_per_request: int
) -> None:
    """Mount ``POST /v1/traces`` on ``app``."""

    async def export_traces(request: Request) -> Response:
        media = (request.headers.get("content-type") or PROTOBUF).split(";")[0].strip().lower()
        as_json = media == JSON
        try:
            if media not in (PROTOBUF, JSON):
                raise _OtlpError(415, f"content-type {media!r} is not OTLP; send {PROTOBUF} or {JSON}")
            body = await _read_body(request, max_body_bytes)
            export = _parse_json(body) if as_json else _parse_protobuf(body)
            count = sum(len(scope.spans) for rs in export.resource_spans for scope in rs.scope_spans)
            if count > max_spans_per_request:
                raise _OtlpError(
                    413,
                    f"{count} spans in one export; this server accepts at most {max_spans_per_request} "
                    "(max_spans_per_request). Lower the exporter's batch size (OTEL_BSP_MAX_EXPORT_BATCH_SIZE).",
                )
            spans, reasons = spans_from_otlp(
                export,
                rollout_id=request.headers.get(semconv.HEADER_ROLLOUT_ID),
                attempt_id=request.headers.get(semconv.HEADER_ATTEMPT_ID),
            )
            for span in spans:
                if span_has_nonfinite(span):
                    raise _OtlpError(400, str(nonfinite_span_error(span)))
        except BodyTooLargeError as exc:
            return _status(413, str(exc.detail), as_json)
        except _OtlpError as exc:
            return _status(exc.status, exc.message, as_json)
        rejected = count - len(spans)
        accepted, store_reasons = await _store_by_attempt(store, spans)
        rejected += len(spans) - accepted
        reasons = [*reasons, *store_reasons]
        metrics.spans_ingested.labels("otlp").inc(accepted)
        if rejected:
            metrics.spans_rejected.inc(rejected)
            logger.warning("OTLP export: %d of %d spans rejected: %s", rejected, count, "; ".join(reasons[:3]))
        return _success(rejected, reasons, as_json)

    app.add_api_route(
        "/v1/traces",
        export_traces,
        methods=["POST"],
        tags=["otlp"],
        summary="OTLP/HTTP trace export",
        response_class=Response,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                    JSON: {"schema": {"type": "object"}},
                },
            },
            "responses": {
                "200": {"description": "ExportTraceServiceResponse (partial_success lists rejected spans)."},
            },
        },
    )

    _document_status_errors(app)


# What the route answers as google.rpc.Status (in the request's encoding), as OTLP/HTTP specifies; 401/403 come from
# the server's edge in its own error shape, and 413 from either (a Content-Length over the limit is refused there).
_STATUS_ERRORS: Final = {
    "400": "google.rpc.Status (code 3): not an OTLP export, or a double that is NaN or Infinity (the message names "
    "the span and attribute; JSON, which the store keeps, has no such numbers).",
    "413": "google.rpc.Status (code 8): more spans than max_spans_per_request, or a body over the limit once "
    "decompressed; ErrorBody when the Content-Length alone is over the limit.",
    "415": "google.rpc.Status (code 3): a content-type or content-encoding OTLP/HTTP does not define.",
}
_RPC_STATUS_SCHEMA: Final = {
    "title": "GoogleRpcStatus",
    "type": "object",
    "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
    "required": ["code", "message"],
}


def _document_status_errors(app: FastAPI) -> None:
    """Make the spec of ``POST /v1/traces`` name the errors it answers: the app-wide ErrorBody ones do not apply."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        spec = generate()
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas["GoogleRpcStatus"] = _RPC_STATUS_SCHEMA
        status = {"$ref": "#/components/schemas/GoogleRpcStatus"}
        binary = {"schema": {"type": "string", "format": "binary"}}
        responses = spec["paths"]["/v1/traces"]["post"]["responses"]
        for code in ("404", "409", "422"):  # the route never answers these
            responses.pop(code, None)
        for code, text in _STATUS_ERRORS.items():
            json_schema = {"oneOf": [status, {"$ref": "#/components/schemas/ErrorBody"}]} if code == "413" else status
            responses[code] = {
                "description": text,
                "content": {PROTOBUF: binary, JSON: {"schema": json_schema}},
            }
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI documents overriding it this way


async def _read_body(request: Request, max_body_bytes: int) -> bytes:
    body = await request.body()
    encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise _OtlpError(415, f"content-encoding {encoding!r} is not supported; send gzip or none")
    # Decompress with a cap: a few kilobytes of gzip can expand to gigabytes.
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, max_body_bytes + 1)
    except zlib.error as exc:
        raise _OtlpError(400, f"body is not valid {encoding}: {exc}") from exc
    if len(data) > max_body_bytes or inflater.unconsumed_tail:
        raise BodyTooLargeError(max_body_bytes, what="decompressed request body")
    return data


def _parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    try:
        return ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise _OtlpError(400, f"body is not an OTLP ExportTraceServiceRequest protobuf: {exc}") from exc


def _parse_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        found = nonfinite_in_refused_json(exc)
        reason = str(exc) if found is None else _describe_otlp_nonfinite(*found)
        raise _OtlpError(400, f"body is not valid JSON: {reason}") from exc
    if not isinstance(parsed, dict):
        raise _OtlpError(400, "body must be an OTLP ExportTraceServiceRequest JSON object")
    data = cast(dict[str, Any], parsed)
    try:
        for holder, key in _id_fields(data):
            holder[key] = _hex_to_base64(holder[key], key)
        return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, AttributeError) as exc:
        raise _OtlpError(400, f"body is not an OTLP ExportTraceServiceRequest: {exc}") from exc


def _describe_otlp_nonfinite(data: object, location: Location, value: float) -> str:
    """Where a bare NaN/Infinity sits in an OTLP/JSON export, with the attribute key and span name it belongs to."""
    node = data
    attribute: object = None
    span: object = None
    previous: str | int | None = None
    for step in location:
        if isinstance(node, dict):
            node = cast(dict[str, Any], node).get(str(step))
        elif isinstance(node, list) and isinstance(step, int):
            node = cast(list[Any], node)[step]
        if isinstance(node, dict) and isinstance(step, int):
            holder = cast(dict[str, Any], node)
            if previous == "attributes" and attribute is None:  # the outermost: a kvlist's keys are inside it
                attribute = holder.get("key")
            elif previous == "spans":
                span = holder.get("name")
        previous = step
    owner = "" if attribute is None else f" (attribute {attribute!r}{'' if span is None else f' of span {span!r}'})"
    return f"{describe_location(location)}{owner} is {describe_float(value)}; {NO_NONFINITE}"


def _id_fields(data: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    # OTLP/JSON writes ids as hex, where the generic protobuf JSON mapping expects base64 (OTLP spec, "JSON").
    def objects(holder: dict[str, Any], *names: str) -> list[dict[str, Any]]:
        for name in names:
            value: Any = holder.get(name)
            if isinstance(value, list):
                items = cast(list[Any], value)
                return [cast(dict[str, Any], item) for item in items if isinstance(item, dict)]
        return []

    for rs in objects(data, "resourceSpans", "resource_spans"):
        for ss in objects(rs, "scopeSpans", "scope_spans"):
            for span in objects(ss, "spans"):
                for holder in (span, *objects(span, "links")):
                    for key in ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"):
                        if isinstance(holder.get(key), str):
                            yield holder, key


def _hex_to_base64(value: str, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except (ValueError, binascii.Error) as exc:
        raise _OtlpError(400, f"{key} {value!r} is not hex (OTLP/JSON writes trace and span ids as hex)") from exc


def _group_by_attempt(spans: list[Span]) -> dict[tuple[str, str], list[Span]]:
    groups: dict[tuple[str, str], list[Span]] = {}
    for span in spans:
        groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
    return groups


async def _store_by_attempt(store: LightningStore, spans: list[Span]) -> tuple[int, list[str]]:
    # One transaction per attempt: an export mixing attempts keeps the spans of valid attempts when one is unknown.
    accepted = 0
    reasons: list[str] = []
    for (rollout_id, attempt_id), group in _group_by_attempt(spans).items():
        try:
            await store.add_spans(group)
        except ValueError as exc:  # NotFoundError included: the attempt does not exist
            reasons.append(f"{len(group)} spans of rollout {rollout_id} attempt {attempt_id} rejected: {exc}")
        else:
            accepted += len(group)
    return accepted, reasons


def _success(rejected: int, reasons: list[str], as_json: bool) -> Response:
    answer = ExportTraceServiceResponse()
    if rejected:
        answer.partial_success.rejected_spans = rejected
        shown = "; ".join(reasons[:_MAX_REASONS])
        more = f" (and {len(reasons) - _MAX_REASONS} more)" if len(reasons) > _MAX_REASONS else ""
        answer.partial_success.error_message = (shown + more) or f"{rejected} spans rejected"
    if as_json:
        return Response(orjson.dumps(json_format.MessageToDict(answer)), media_type=JSON)
    return Response(answer.SerializeToString(), media_type=PROTOBUF)


def _status(code: int, message: str, as_json: bool) -> Response:
    # google.rpc.Status (code = 3 INVALID_ARGUMENT, 8 RESOURCE_EXHAUSTED) encoded by hand: two fields do not
    # justify a dependency on googleapis-common-protos.
    rpc_code = 8 if code == 413 else 3
    if as_json:
        return Response(orjson.dumps({"code": rpc_code, "message": message}), status_code=code, media_type=JSON)
    text = message.encode()
    payload = b"\x08" + _varint(rpc_code) + b"\x12" + _varint(len(text)) + text
    return Response(payload, status_code=code, media_type=PROTOBUF)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
