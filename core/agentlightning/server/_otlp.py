"""OTLP/HTTP trace ingest (``POST /v1/traces``): any OpenTelemetry exporter can send spans with no SDK of ours.

The shared pieces (body reading, JSON ids, google.rpc.Status answers, storing per attempt) serve ``POST /v1/logs``
too (:mod:`agentlightning.server._otlp_logs`).

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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

import orjson
from fastapi import FastAPI, Request
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
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

_Export = TypeVar("_Export", bound=Message)
_SPAN_CONTAINERS: Final = ("resourceSpans", "scopeSpans", "spans")

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
_MAX_REASONS: Final = 5


class OtlpError(Exception):
    """A refused OTLP export: answered as google.rpc.Status with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class OtlpSignal:
    """What differs between the OTLP exports this server takes (traces, logs); :func:`export_handler` does the rest."""

    request_type: type[Message]
    json_containers: tuple[str, str, str]
    count: Callable[[Any], int]
    """Items (spans, log records) in a parsed export."""
    to_spans: Callable[..., tuple[list[Span], list[str]]]
    """(export, rollout_id=, attempt_id=) -> spans to store and the reasons for items rejected."""
    new_answer: Callable[[], Message]
    set_rejected: Callable[[Any, int], None]
    """Writes the rejected count into the answer's ``partial_success``."""
    noun: str
    metrics_source: str
    batch_size_env: str
    """The exporter's batch size setting, named in a 413."""


OTLP_REQUEST_BODY: Final = {
    "required": True,
    "content": {PROTOBUF: {"schema": {"type": "string", "format": "binary"}}, JSON: {"schema": {"type": "object"}}},
}


def export_handler(
    signal: OtlpSignal, store: LightningStore, *, metrics: StoreMetrics, max_body_bytes: int, max_items: int
) -> Callable[[Request], Awaitable[Response]]:
    """The route of one OTLP/HTTP signal: parse, bound, convert, refuse non-finite doubles, store per attempt, answer
    ``partial_success`` for what was rejected (4xx as google.rpc.Status in the request's encoding)."""

    async def export(request: Request) -> Response:
        media = (request.headers.get("content-type") or PROTOBUF).split(";")[0].strip().lower()
        as_json = media == JSON
        try:
            if media not in (PROTOBUF, JSON):
                raise OtlpError(415, f"content-type {media!r} is not OTLP; send {PROTOBUF} or {JSON}")
            body = await read_body(request, max_body_bytes)
            parsed = (
                parse_json(body, signal.request_type, signal.json_containers)
                if as_json
                else parse_protobuf(body, signal.request_type)
            )
            count = signal.count(parsed)
            if count > max_items:
                raise OtlpError(
                    413,
                    f"{count} {signal.noun} in one export; this server accepts at most {max_items} "
                    f"(max_spans_per_request). Lower the exporter's batch size ({signal.batch_size_env}).",
                )
            spans, reasons = signal.to_spans(
                parsed,
                rollout_id=request.headers.get(semconv.HEADER_ROLLOUT_ID),
                attempt_id=request.headers.get(semconv.HEADER_ATTEMPT_ID),
            )
            for span in spans:
                if span_has_nonfinite(span):
                    raise OtlpError(400, str(nonfinite_span_error(span)))
        except BodyTooLargeError as exc:
            return status_response(413, str(exc.detail), as_json)
        except OtlpError as exc:
            return status_response(exc.status, exc.message, as_json)
        accepted, store_reasons = await store_by_attempt(store, spans)
        rejected = count - accepted
        reasons = [*reasons, *store_reasons]
        metrics.spans_ingested.labels(signal.metrics_source).inc(accepted)
        answer = signal.new_answer()
        if rejected:
            metrics.spans_rejected.inc(rejected)
            logger.warning(
                "OTLP export: %d of %d %s rejected: %s", rejected, count, signal.noun, "; ".join(reasons[:3])
            )
            signal.set_rejected(answer, rejected)
            cast(Any, answer).partial_success.error_message = partial_message(rejected, reasons, signal.noun)
        return encode_answer(answer, as_json)

    return export


def _count_spans(export: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for rs in export.resource_spans for scope in rs.scope_spans)


def _set_rejected_spans(answer: Any, rejected: int) -> None:
    answer.partial_success.rejected_spans = rejected


TRACES: Final = OtlpSignal(
    request_type=ExportTraceServiceRequest,
    json_containers=_SPAN_CONTAINERS,
    count=_count_spans,
    to_spans=spans_from_otlp,
    new_answer=ExportTraceServiceResponse,
    set_rejected=_set_rejected_spans,
    noun="spans",
    metrics_source="otlp",
    batch_size_env="OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
)


def add_otlp_route(
    app: FastAPI, store: LightningStore, *, metrics: StoreMetrics, max_body_bytes: int, max_spans_per_request: int
) -> None:
    """Mount ``POST /v1/traces`` on ``app``."""
    export_traces = export_handler(
        TRACES, store, metrics=metrics, max_body_bytes=max_body_bytes, max_items=max_spans_per_request
    )

    app.add_api_route(
        "/v1/traces",
        export_traces,
        methods=["POST"],
        tags=["otlp"],
        summary="OTLP/HTTP trace export",
        response_class=Response,
        openapi_extra={
            "requestBody": OTLP_REQUEST_BODY,
            "responses": {
                "200": {"description": "ExportTraceServiceResponse (partial_success lists rejected spans)."},
            },
        },
    )

    document_status_errors(app, "/v1/traces", "spans")


# What the routes answer as google.rpc.Status (in the request's encoding), as OTLP/HTTP specifies; 401/403 come from
# the server's edge in its own error shape, and 413 from either (a Content-Length over the limit is refused there).
_STATUS_ERRORS: Final = {
    "400": "google.rpc.Status (code 3): not an OTLP export, or a double that is NaN or Infinity (the message names "
    "the {noun} and attribute; JSON, which the store keeps, has no such numbers).",
    "413": "google.rpc.Status (code 8): more {noun} than max_spans_per_request, or a body over the limit once "
    "decompressed; ErrorBody when the Content-Length alone is over the limit.",
    "415": "google.rpc.Status (code 3): a content-type or content-encoding OTLP/HTTP does not define.",
}
_RPC_STATUS_SCHEMA: Final = {
    "title": "GoogleRpcStatus",
    "type": "object",
    "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
    "required": ["code", "message"],
}


def document_status_errors(app: FastAPI, path: str, noun: str) -> None:
    """Make the spec of ``POST path`` name the errors it answers: the app-wide ErrorBody ones do not apply."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        spec = generate()
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas["GoogleRpcStatus"] = _RPC_STATUS_SCHEMA
        status = {"$ref": "#/components/schemas/GoogleRpcStatus"}
        binary = {"schema": {"type": "string", "format": "binary"}}
        responses = spec["paths"][path]["post"]["responses"]
        for code in ("404", "409", "422"):  # the route never answers these
            responses.pop(code, None)
        for code, text in _STATUS_ERRORS.items():
            json_schema = {"oneOf": [status, {"$ref": "#/components/schemas/ErrorBody"}]} if code == "413" else status
            responses[code] = {
                "description": text.format(noun=noun),
                "content": {PROTOBUF: binary, JSON: {"schema": json_schema}},
            }
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI documents overriding it this way


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request body, inflated (gzip or deflate) up to ``max_body_bytes``."""
    body = await request.body()
    encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise OtlpError(415, f"content-encoding {encoding!r} is not supported; send gzip or none")
    # Decompress with a cap: a few kilobytes of gzip can expand to gigabytes.
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, max_body_bytes + 1)
    except zlib.error as exc:
        raise OtlpError(400, f"body is not valid {encoding}: {exc}") from exc
    if len(data) > max_body_bytes or inflater.unconsumed_tail:
        raise BodyTooLargeError(max_body_bytes, what="decompressed request body")
    return data


def parse_protobuf(body: bytes, message: type[_Export]) -> _Export:
    """An OTLP/protobuf export as ``message``."""
    try:
        return message.FromString(body)
    except DecodeError as exc:
        raise OtlpError(400, f"body is not an OTLP {message.__name__} protobuf: {exc}") from exc


def parse_json(body: bytes, message: type[_Export], containers: tuple[str, str, str]) -> _Export:
    """An OTLP/JSON export as its protobuf ``message``; ``containers`` name the resource, scope and item lists."""
    name = message.__name__
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        found = nonfinite_in_refused_json(exc)
        reason = str(exc) if found is None else _describe_otlp_nonfinite(*found)
        raise OtlpError(400, f"body is not valid JSON: {reason}") from exc
    if not isinstance(parsed, dict):
        raise OtlpError(400, f"body must be an OTLP {name} JSON object")
    data = cast(dict[str, Any], parsed)
    try:
        for holder, key in _id_fields(data, containers):
            holder[key] = _hex_to_base64(holder[key], key)
        return json_format.ParseDict(data, message(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, AttributeError) as exc:
        raise OtlpError(400, f"body is not an OTLP {name}: {exc}") from exc


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
            elif previous in ("spans", "logRecords", "log_records"):
                span = holder.get("name") or holder.get("eventName") or holder.get("event_name")
        previous = step
    owner = "" if attribute is None else f" (attribute {attribute!r}{'' if span is None else f' of span {span!r}'})"
    return f"{describe_location(location)}{owner} is {describe_float(value)}; {NO_NONFINITE}"


def _id_fields(data: dict[str, Any], containers: tuple[str, str, str]) -> Iterator[tuple[dict[str, Any], str]]:
    # OTLP/JSON writes ids as hex, where the generic protobuf JSON mapping expects base64 (OTLP spec, "JSON").
    def objects(holder: dict[str, Any], *names: str) -> list[dict[str, Any]]:
        for name in names:
            value: Any = holder.get(name)
            if isinstance(value, list):
                items = cast(list[Any], value)
                return [cast(dict[str, Any], item) for item in items if isinstance(item, dict)]
        return []

    resources, scopes, items = containers
    for rs in objects(data, resources, _snake(resources)):
        for ss in objects(rs, scopes, _snake(scopes)):
            for item in objects(ss, items, _snake(items)):
                for holder in (item, *objects(item, "links")):
                    for key in ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"):
                        if isinstance(holder.get(key), str):
                            yield holder, key


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _hex_to_base64(value: str, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except (ValueError, binascii.Error) as exc:
        raise OtlpError(400, f"{key} {value!r} is not hex (OTLP/JSON writes trace and span ids as hex)") from exc


def _group_by_attempt(spans: list[Span]) -> dict[tuple[str, str], list[Span]]:
    groups: dict[tuple[str, str], list[Span]] = {}
    for span in spans:
        groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
    return groups


async def store_by_attempt(store: LightningStore, spans: list[Span]) -> tuple[int, list[str]]:
    """Add spans one attempt at a time: (how many were stored, why the others were not)."""
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


def partial_message(rejected: int, reasons: list[str], noun: str) -> str:
    """``partial_success.error_message``: the first reasons, and how many more there were."""
    shown = "; ".join(reasons[:_MAX_REASONS])
    more = f" (and {len(reasons) - _MAX_REASONS} more)" if len(reasons) > _MAX_REASONS else ""
    return (shown + more) or f"{rejected} {noun} rejected"


def encode_answer(answer: Message, as_json: bool) -> Response:
    """An export's 200 answer in the request's encoding."""
    if as_json:
        return Response(orjson.dumps(json_format.MessageToDict(answer)), media_type=JSON)
    return Response(answer.SerializeToString(), media_type=PROTOBUF)


def status_response(code: int, message: str, as_json: bool) -> Response:
    """A refusal as google.rpc.Status in the request's encoding."""
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
