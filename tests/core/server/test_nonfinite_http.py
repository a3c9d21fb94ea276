"""NaN and Infinity are refused at the server's edges, naming where they are, so no rollout is poisoned (issue #26).

Before, ``POST /v1/spans`` accepted the JSON extensions ``NaN``/``Infinity``, the store wrote them as ``null``, and
every later read of the rollout failed validation. Each test sends the value over a real loopback HTTP server (REST
and OTLP, protobuf and JSON) and then reads the rollout back through the project's HTTP client, as a trainer does.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from google.rpc import status_pb2  # googleapis-common-protos comes with the OTLP exporter
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlightning import semconv
from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer
from agentlightning.store import LightningStore, SqliteLightningStore
from agentlightning.store.memory import InMemoryLightningStore

KEY = "gen_ai.usage.x"
# (JSON text of the value, how the answer names it)
LITERALS = [("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e999", "Infinity")]


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    """The store behind the server (overrides conftest's memory-only one): the in-memory and the SQLite backend."""
    backend: LightningStore = (
        InMemoryLightningStore() if request.param == "memory" else SqliteLightningStore(tmp_path / "store.db")
    )
    yield backend
    await backend.close()


@pytest.fixture
def server(store: LightningStore) -> Iterator[StoreServer]:
    """``store`` served on an ephemeral loopback port."""
    with StoreServer(store, max_wait_s=2.0) as running:
        yield running


@pytest.fixture
async def trainer(server: StoreServer) -> AsyncIterator[LightningStoreClient]:
    """The project's HTTP client, reading the store as a trainer does."""
    client = LightningStoreClient(server.url)
    yield client
    await client.close()


async def _attempt(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout({"task": 1})
    claimed = await store.claim_and_start("w")
    assert claimed is not None
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def _span_json(rollout_id: str, attempt_id: str, index: int, value: str = "1.5") -> str:
    """One span as JSON text, ``value`` (JSON text) under the attribute KEY."""
    return (
        f'{{"rollout_id": "{rollout_id}", "attempt_id": "{attempt_id}", "trace_id": "{1:032x}", '
        f'"span_id": "{index + 1:016x}", "name": "chat", "start_time": {index}, "attributes": {{"{KEY}": {value}}}}}'
    )


@pytest.fixture
async def http(server: StoreServer) -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client of the server, for bodies the project's client would never send."""
    async with httpx.AsyncClient(base_url=server.url) as client:
        yield client


async def _post(
    http: httpx.AsyncClient, path: str, body: str | bytes, content_type: str = "application/json"
) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else body
    return await http.post(path, content=content, headers={"content-type": content_type})


@pytest.mark.parametrize(("literal", "named"), LITERALS)
@pytest.mark.parametrize("content_type", ["application/json", "application/vnd.agentlightning+json"])
async def test_rest_spans_with_nonfinite_are_400_naming_the_attribute(
    store: LightningStore,
    http: httpx.AsyncClient,
    trainer: LightningStoreClient,
    literal: str,
    named: str,
    content_type: str,
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    good = await _post(http, "/v1/spans", f'{{"spans": [{_span_json(rollout_id, attempt_id, 0)}]}}')
    assert good.status_code == 200, good.text
    spans = [_span_json(rollout_id, attempt_id, 1), _span_json(rollout_id, attempt_id, 2, literal)]
    # content_type: the route's direct binder ("application/json") and FastAPI's own handler ("+json") alike.
    answer = await _post(http, "/v1/spans", f'{{"spans": [{", ".join(spans)}]}}', content_type)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert f"spans[1].attributes['{KEY}'] is {named}" in detail and "JSON has no NaN/Infinity" in detail
    # Nothing of the refused batch was stored, and the rollout still reads.
    assert [s.span_id for s in await trainer.query_spans(rollout_id)] == [f"{1:016x}"]


async def test_python_json_client_sending_nan_is_refused(
    store: LightningStore, http: httpx.AsyncClient, trainer: LightningStoreClient
) -> None:
    # json.dumps (which requests uses for json=) writes a float infinity as the bare literal Infinity.
    rollout_id, attempt_id = await _attempt(store)
    span: dict[str, Any] = json.loads(_span_json(rollout_id, attempt_id, 0))
    span["events"] = [{"name": "step", "timestamp": 1, "attributes": {"reward": [0.5, math.inf]}}]
    answer = await _post(http, "/v1/spans", json.dumps({"spans": [span]}))
    assert answer.status_code == 400
    assert "spans[0].events[0].attributes.reward[1] is Infinity" in answer.json()["detail"]
    assert await trainer.query_spans(rollout_id) == []


async def test_finish_with_nonfinite_spans_is_refused_and_the_attempt_keeps_running(
    store: LightningStore, http: httpx.AsyncClient, trainer: LightningStoreClient
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    body = f'{{"status": "succeeded", "spans": [{_span_json(rollout_id, attempt_id, 0, "-Infinity")}]}}'
    answer = await _post(http, f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish", body)
    assert answer.status_code == 400
    assert f"spans[0].attributes['{KEY}'] is -Infinity" in answer.json()["detail"]
    assert (await trainer.get_rollout(rollout_id)).status == "running"
    assert await trainer.query_spans(rollout_id) == []


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "named"),
    [
        ("POST", "/v1/rollouts", '{"requests": [{"input": {"x": NaN}}]}', 400, "requests[0].input.x is NaN"),
        ("POST", "/v1/rollouts", '{"requests": [{"input": 1, "metadata": {"s": 1e400}}]}', 400, "metadata.s"),
        ("POST", "/v1/rollouts", '{"requests": [{"input": 1, "config": {"timeout_s": "inf"}}]}', 422, "timeout_s"),
        ("POST", "/v1/rollouts", '{"requests": [{"input": 1, "config": {"timeout_s": 1e999}}]}', 400, "timeout_s"),
        ("POST", "/v1/rollouts/claim", '{"timeout_s": Infinity}', 400, "timeout_s is Infinity"),
        ("PATCH", "/v1/rollouts/{rollout_id}/metadata", '{"metadata": {"score": NaN}}', 400, "metadata.score"),
        (
            "POST",
            "/v1/resources",
            '{"resources": {"llm": {"kind": "llm", "base_url": "http://x/v1", "model": "m", '
            '"sampling": {"temperature": -Infinity}}}}',
            400,
            "resources.llm.sampling.temperature is -Infinity",
        ),
    ],
)
async def test_other_write_routes_refuse_nonfinite_numbers(
    store: LightningStore,
    http: httpx.AsyncClient,
    trainer: LightningStoreClient,
    method: str,
    path: str,
    body: str,
    status: int,
    named: str,
) -> None:
    rollout_id, _ = await _attempt(store)
    before = await trainer.query_rollouts()
    url = path.format(rollout_id=rollout_id)
    answer = await http.request(method, url, content=body.encode(), headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    assert named in answer.json()["detail"]
    assert await trainer.query_rollouts() == before  # nothing enqueued or changed
    assert await trainer.list_resources() == []


# --- OTLP ----------------------------------------------------------------------------------------------------------
def _otlp_export(rollout_id: str, attempt_id: str, set_values: Any) -> bytes:
    """A protobuf export of two spans recorded by the real SDK; ``set_values(span)`` adds attributes to the second."""
    memory = InMemorySpanExporter()
    ids = {semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id}
    provider = TracerProvider(resource=Resource.create(ids))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("invoke_agent planner"), tracer.start_as_current_span("chat m") as child:
        set_values(child)
    provider.shutdown()
    return encode_spans(list(memory.get_finished_spans())).SerializeToString()


def _otlp_message(answer: httpx.Response) -> str:
    if answer.headers["content-type"].startswith("application/json"):
        return str(orjson.loads(answer.content)["message"])
    return status_pb2.Status.FromString(answer.content).message


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (math.nan, f"attribute '{KEY}' is NaN"),
        (math.inf, f"attribute '{KEY}' is Infinity"),
        ([0.5, -math.inf], f"attribute '{KEY}' item 1 is -Infinity"),
    ],
)
async def test_otlp_protobuf_with_nonfinite_double_is_400(
    store: LightningStore, http: httpx.AsyncClient, trainer: LightningStoreClient, value: Any, named: str
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    body = _otlp_export(rollout_id, attempt_id, lambda span: span.set_attribute(KEY, value))
    answer = await _post(http, "/v1/traces", body, "application/x-protobuf")
    assert answer.status_code == 400
    message = _otlp_message(answer)
    assert "'chat m'" in message and named in message and "JSON has no NaN/Infinity" in message
    assert await trainer.query_spans(rollout_id) == []


async def test_otlp_protobuf_with_nonfinite_event_attribute_is_400(
    store: LightningStore, http: httpx.AsyncClient, trainer: LightningStoreClient
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    body = _otlp_export(rollout_id, attempt_id, lambda span: span.add_event("delta", {"logprob": -math.inf}))
    answer = await _post(http, "/v1/traces", body, "application/x-protobuf")
    assert answer.status_code == 400
    assert "event 0 ('delta') attribute 'logprob' is -Infinity" in _otlp_message(answer)
    assert await trainer.query_spans(rollout_id) == []


def _otlp_json(rollout_id: str, attempt_id: str, double: str) -> str:
    """An OTLP/JSON export of one span whose attribute KEY is ``double`` (JSON text) as a doubleValue."""
    ids = (
        f'{{"key": "{semconv.ROLLOUT_ID}", "value": {{"stringValue": "{rollout_id}"}}}}, '
        f'{{"key": "{semconv.ATTEMPT_ID}", "value": {{"stringValue": "{attempt_id}"}}}}'
    )
    span = (
        '{"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "chat", '
        '"startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": "1544712661000000000", '
        f'"attributes": [{{"key": "ok", "value": {{"intValue": "1"}}}}, {{"key": "{KEY}", "value": '
        f'{{"doubleValue": {double}}}}}]}}'
    )
    return f'{{"resourceSpans": [{{"resource": {{"attributes": [{ids}]}}, "scopeSpans": [{{"spans": [{span}]}}]}}]}}'


@pytest.mark.parametrize(
    ("double", "named"),
    [
        ('"NaN"', "NaN"),  # how the protobuf JSON mapping (and so OTLP/JSON) writes a NaN double
        ('"-Infinity"', "-Infinity"),
        ("NaN", "NaN"),  # the bare literal, which is not JSON
        ("Infinity", "Infinity"),
        ("1e999", "Infinity"),
    ],
)
async def test_otlp_json_with_nonfinite_double_is_400(
    store: LightningStore, http: httpx.AsyncClient, trainer: LightningStoreClient, double: str, named: str
) -> None:
    rollout_id, attempt_id = await _attempt(store)
    answer = await _post(http, "/v1/traces", _otlp_json(rollout_id, attempt_id, double))
    assert answer.status_code == 400
    message = _otlp_message(answer)
    assert f"attribute '{KEY}'" in message and f"is {named}" in message and "'chat'" in message
    assert await trainer.query_spans(rollout_id) == []
    # The same export with a finite double is stored: only the non-finite value was refused.
    assert (await _post(http, "/v1/traces", _otlp_json(rollout_id, attempt_id, "0.25"))).status_code == 200
    (span,) = await trainer.query_spans(rollout_id)
    assert span.attributes[KEY] == 0.25


async def test_openapi_documents_the_refusal(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    add_spans = spec["paths"]["/v1/spans"]["post"]
    assert "NaN" in add_spans["description"] and "400" in add_spans["responses"]
    assert "NaN" in add_spans["responses"]["400"]["description"]
    assert "NaN" in spec["paths"]["/v1/traces"]["post"]["responses"]["400"]["description"]


async def test_the_projects_client_refuses_nonfinite_spans_before_sending(
    store: LightningStore, trainer: LightningStoreClient
) -> None:
    """Serialised, NaN would become ``null`` and the server would answer a list of type errors; the client raises
    the stores' own error, naming the attribute, and sends nothing."""
    from agentlightning.types import Span

    rollout_id, attempt_id = await _attempt(store)
    span = Span.model_validate(json.loads(_span_json(rollout_id, attempt_id, 0)))
    bad = span.model_copy(update={"span_id": f"{2:016x}", "attributes": {KEY: [0.5, math.nan]}})
    with pytest.raises(ValueError, match=rf"span 1 .*attribute '{KEY}' item 1 is NaN"):
        await trainer.add_spans([span, bad])
    with pytest.raises(ValueError, match="is NaN"):
        await trainer.finish_attempt_with_spans(rollout_id, attempt_id, "succeeded", [bad])
    assert await trainer.query_spans(rollout_id) == []
    assert (await trainer.query_attempts(rollout_id))[0].status == "running"
