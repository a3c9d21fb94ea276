"""The store as a FastAPI app: every :class:`LightningStore` operation under ``/v1/…``, plus health and metrics."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from agentlightning import __version__, _wire as m
from agentlightning.server._fast_route import FastRoute, OrjsonRoute
from agentlightning.server._metrics_routes import add_metrics_routes
from agentlightning.server._middleware import StoreEdgeMiddleware, StoreMetrics
from agentlightning.server._otlp import add_otlp_route
from agentlightning.server._otlp_logs import add_otlp_logs_route
from agentlightning.store._keys import MAX_KEY_LENGTH
from agentlightning.store.base import IllegalTransitionError, LightningStore, NotFoundError, StoreStatistics
from agentlightning.types import (
    Attempt,
    ClaimedRollout,
    ResourcesSnapshot,
    Rollout,
    Span,
)

DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
DEFAULT_MAX_SPANS_PER_REQUEST: Final = 10_000
DEFAULT_MAX_WAIT_S: Final = 30.0
# Idle claimers re-check the store at most this often, so rollouts made claimable by another writer of the same
# database (another server, the store's own watchdog) are seen; claims through this server wake them at once.
_CLAIM_POLL_MAX_S: Final = 0.25

_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    code: {"model": m.ErrorBody, "description": text}
    for code, text in {
        400: "Malformed body: not JSON (nor are NaN, Infinity and numbers beyond the double range), not protobuf.",
        401: "Missing bearer token.",
        403: "Wrong bearer token.",
        404: "Unknown rollout, attempt or resources id.",
        409: "Illegal state change.",
        413: "Body, span or metrics record count over the server's limit.",
        422: "Body or parameters fail validation.",
    }.items()
}


class _ClaimWaker:
    """Wakes long-polling claimers when a rollout may have become claimable through this server."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        """The event the next change will set; take it *before* looking at the queue so no change is missed."""
        return self._event

    def notify(self) -> None:
        """Wake every waiter (enqueue, requeue, watchdog)."""
        event, self._event = self._event, asyncio.Event()
        event.set()


def _no_native_telemetry() -> dict[str, Any]:
    # FastAPI >= 0.16x traces its own requests through the *global* OpenTelemetry provider. In a process whose
    # provider ships spans to this store (a runner embedding the server), each store request would then produce a
    # span that is sent to the store, and so on. The store has its own metrics; older FastAPI lacks the option.
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


def _json(adapter: Any, value: Any) -> Response:
    # Serialised straight to bytes by pydantic-core; FastAPI's response_model only documents the shape.
    return Response(adapter.dump_json(value), media_type="application/json")


def create_app(
    store: LightningStore,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_spans_per_request: int = DEFAULT_MAX_SPANS_PER_REQUEST,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
) -> FastAPI:
    """The store served over HTTP: REST under /v1, OTLP /v1/traces and /v1/logs, /health, /metrics."""
    if max_body_bytes <= 0 or max_spans_per_request <= 0 or max_wait_s <= 0:
        raise ValueError(
            f"limits must be positive: max_body_bytes={max_body_bytes}, "
            f"max_spans_per_request={max_spans_per_request}, max_wait_s={max_wait_s}"
        )
    metrics = StoreMetrics()
    waker = _ClaimWaker()
    app = FastAPI(
        **_no_native_telemetry(),
        title="Agent Lightning store",
        version=__version__,
        description="The LightningStore (rollout queue, attempts, spans, resources) over HTTP, and OTLP/HTTP ingest.",
        responses=_ERRORS,
        redirect_slashes=False,  # an empty id ("/v1/rollouts/") is a 404, not a redirect to another operation
    )
    app.router.route_class = FastRoute  # every store endpoint below returns a Response itself
    app.add_middleware(StoreEdgeMiddleware, token=token, max_body_bytes=max_body_bytes, metrics=metrics)
    _add_error_handlers(app)

    def too_many_spans(count: int) -> HTTPException:
        return HTTPException(
            413,
            f"{count} spans in one request; this server accepts at most {max_spans_per_request} "
            "(max_spans_per_request). Send them in smaller batches.",
        )

    def wait_budget(timeout_s: float | None) -> float:
        return max_wait_s if timeout_s is None else min(timeout_s, max_wait_s)

    v1 = m.API_PREFIX
    # The store records the key with the write, in its transaction: a retry acts once, even after a restart.
    IdemKey = Header(
        default=None,
        alias=m.IDEMPOTENCY_HEADER,
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description="Retries with the same key act once (kept for a day, across server restarts).",
    )

    # --- rollout queue ---------------------------------------------------------------------------------------------
    @app.post(f"{v1}/rollouts", response_model=list[Rollout], tags=["rollouts"])
    async def enqueue_rollouts(body: m.EnqueueRolloutsBody, key: str | None = IdemKey) -> Response:
        """Enqueue rollouts in order (one transaction)."""
        rollouts = await store.enqueue_rollouts(body.requests, idempotency_key=key)
        waker.notify()
        return _json(m.ROLLOUTS, rollouts)

    @app.post(f"{v1}/rollouts/query", response_model=list[Rollout], tags=["rollouts"])
    async def query_rollouts(body: m.QueryRolloutsBody) -> Response:
        """Rollouts matching all given filters, in enqueue order."""
        rollouts = await store.query_rollouts(
            status=body.status,
            mode=body.mode,
            rollout_ids=body.rollout_ids,
            group_id=body.group_id,
            sort=body.sort,
            limit=body.limit,
            offset=body.offset,
        )
        return _json(m.ROLLOUTS, rollouts)

    @app.post(f"{v1}/rollouts/wait", response_model=list[Rollout], tags=["rollouts"])
    async def wait_for_rollouts(body: m.WaitForRolloutsBody) -> Response:
        """Long-poll until the rollouts are terminal (bounded by the server's wait limit); returns the terminal ones."""
        rollouts = await store.wait_for_rollouts(body.rollout_ids, timeout_s=wait_budget(body.timeout_s))
        return _json(m.ROLLOUTS, rollouts)

    @app.post(f"{v1}/rollouts/claim", response_model=ClaimedRollout | None, tags=["rollouts"])
    async def claim_rollout(body: m.ClaimRolloutBody, request: Request, key: str | None = IdemKey) -> Response:
        """Claim the oldest claimable rollout (and start its attempt if asked), long-polling up to ``timeout_s``."""
        budget = 0.0 if body.timeout_s is None else wait_budget(body.timeout_s)
        claim = store.claim_and_start if body.start else store.claim_rollout

        async def claim_once(worker_id: str | None) -> ClaimedRollout | None:
            return await claim(worker_id, idempotency_key=key)

        claimed = await _claim_waiting(claim_once, waker, request, body.worker_id, budget)
        return _json(m.CLAIMED, claimed)

    @app.get(f"{v1}/rollouts/{{rollout_id}}", response_model=Rollout, tags=["rollouts"])
    async def get_rollout(rollout_id: str) -> Response:
        """One rollout."""
        return _json(m.ROLLOUT, await store.get_rollout(rollout_id))

    @app.post(f"{v1}/rollouts/{{rollout_id}}/cancel", response_model=Rollout, tags=["rollouts"])
    async def cancel_rollout(rollout_id: str, key: str | None = IdemKey) -> Response:
        """Cancel a non-terminal rollout."""
        return _json(m.ROLLOUT, await store.cancel_rollout(rollout_id, idempotency_key=key))

    @app.patch(f"{v1}/rollouts/{{rollout_id}}/metadata", response_model=Rollout, tags=["rollouts"])
    async def update_rollout_metadata(rollout_id: str, body: m.UpdateMetadataBody) -> Response:
        """Merge keys into a rollout's metadata."""
        return _json(m.ROLLOUT, await store.update_rollout_metadata(rollout_id, body.metadata))

    @app.get(f"{v1}/rollouts/{{rollout_id}}/attempts", response_model=list[Attempt], tags=["attempts"])
    async def query_attempts(rollout_id: str) -> Response:
        """Attempts of a rollout, oldest first."""
        return _json(m.ATTEMPTS, await store.query_attempts(rollout_id))

    attempt_path = f"{v1}/rollouts/{{rollout_id}}/attempts/{{attempt_id}}"

    @app.post(f"{attempt_path}/start", response_model=Attempt, tags=["attempts"])
    async def start_attempt(rollout_id: str, attempt_id: str, key: str | None = IdemKey) -> Response:
        """Mark a claimed attempt and its rollout running."""
        return _json(m.ATTEMPT, await store.start_attempt(rollout_id, attempt_id, idempotency_key=key))

    @app.post(f"{attempt_path}/finish", response_model=Attempt, tags=["attempts"])
    async def finish_attempt(
        rollout_id: str, attempt_id: str, body: m.FinishAttemptBody, key: str | None = IdemKey
    ) -> Response:
        """Store the attempt's last spans if given, then record its terminal status; the rollout moves on."""
        if len(body.spans) > max_spans_per_request:
            raise too_many_spans(len(body.spans))

        if body.spans:
            attempt = await store.finish_attempt_with_spans(
                rollout_id, attempt_id, body.status, body.spans, error=body.error, idempotency_key=key
            )
            metrics.spans_ingested.labels("rest").inc(len(body.spans))
        else:
            attempt = await store.finish_attempt(
                rollout_id, attempt_id, body.status, error=body.error, idempotency_key=key
            )
        waker.notify()
        return _json(m.ATTEMPT, attempt)

    @app.post(f"{attempt_path}/heartbeat", response_model=Attempt, tags=["attempts"])
    async def heartbeat(rollout_id: str, attempt_id: str) -> Response:
        """Prove an attempt is alive."""
        return _json(m.ATTEMPT, await store.heartbeat(rollout_id, attempt_id))

    # --- spans -----------------------------------------------------------------------------------------------------
    @app.post(f"{v1}/spans", response_model=list[Span] | list[int | Span], tags=["spans"])
    async def add_spans(
        body: m.AddSpansBody,
        response: m.SpansAnswer = Query(
            default="spans",
            description="spans: the stored spans. sequence_ids: per span, its sequence id when it is stored exactly "
            "as sent, else the stored span (saves the caller from re-reading what it just sent).",
        ),
    ) -> Response:
        """Store spans (idempotent on rollout, attempt and span id); returns them with their sequence ids.

        An attribute value that is NaN or ±Infinity cannot be stored (JSON has no such numbers): the body is refused
        with 400 naming the span and attribute (``spans[3].attributes['gen_ai.usage.x'] is NaN; ...``).
        """
        if len(body.spans) > max_spans_per_request:
            raise too_many_spans(len(body.spans))
        stored = await store.add_spans(body.spans)
        metrics.spans_ingested.labels("rest").inc(len(body.spans))
        if response == "spans":
            return _json(m.SPANS, stored)
        pairs = zip(stored, body.spans, strict=True)
        compact = [kept.sequence_id if _same_span(kept, sent) else kept for kept, sent in pairs]
        return _json(m.SEQUENCE_IDS_OR_SPANS, compact)

    @app.get(f"{v1}/rollouts/{{rollout_id}}/spans", response_model=list[Span], tags=["spans"])
    async def query_spans(
        rollout_id: str,
        attempt_id: str | None = Query(default=None, description='An attempt id, "latest", or none for all.'),
        name: str | None = None,
        after_sequence_id: int = Query(default=0, ge=0, le=m.MAX_INT64),
        limit: int | None = Query(default=None, ge=0, le=m.MAX_INT64),
        offset: int = Query(default=0, ge=0, le=m.MAX_INT64),
    ) -> Response:
        """Spans of a rollout in (attempt, sequence id) order."""
        spans = await store.query_spans(
            rollout_id, attempt_id, name=name, after_sequence_id=after_sequence_id, limit=limit, offset=offset
        )
        return _json(m.SPANS, spans)

    # --- resources -------------------------------------------------------------------------------------------------
    @app.post(f"{v1}/resources", response_model=ResourcesSnapshot, tags=["resources"])
    async def add_resources(body: m.AddResourcesBody, key: str | None = IdemKey) -> Response:
        """Store a new immutable resources snapshot; it becomes the latest."""

        return _json(m.SNAPSHOT, await store.add_resources(body.resources, idempotency_key=key))

    @app.get(f"{v1}/resources", response_model=list[ResourcesSnapshot], tags=["resources"])
    async def list_resources() -> Response:
        """All snapshots, oldest first."""
        return _json(m.SNAPSHOTS, await store.list_resources())

    @app.get(f"{v1}/resources/latest", response_model=ResourcesSnapshot | None, tags=["resources"])
    async def get_latest_resources() -> Response:
        """The latest snapshot, or null when there is none."""
        return _json(m.SNAPSHOT_OR_NONE, await store.get_resources(None))

    @app.get(f"{v1}/resources/{{resources_id}}", response_model=ResourcesSnapshot, tags=["resources"])
    async def get_resources(resources_id: str) -> Response:
        """A snapshot by id."""
        return _json(m.SNAPSHOT, await store.get_resources(resources_id))

    add_metrics_routes(app, store, max_records=max_spans_per_request)  # /v1/metrics: per-step training metrics

    # --- operations ------------------------------------------------------------------------------------------------
    @app.post(f"{v1}/watchdog/check", response_model=list[Attempt], tags=["operations"])
    async def check_timeouts(body: m.CheckTimeoutsBody) -> Response:
        """One watchdog tick: time out silent or overlong attempts; returns those changed."""
        changed = await store.check_timeouts(body.now)
        if changed:
            waker.notify()
        return _json(m.ATTEMPTS, changed)

    @app.get(f"{v1}/statistics", response_model=StoreStatistics, tags=["operations"])
    async def statistics() -> Response:
        """Counts per status, spans and bytes."""
        stats = await store.statistics()
        return Response(stats.model_dump_json(), media_type="application/json")

    @app.get("/health", response_model=m.HealthBody, tags=["operations"])
    async def health() -> Response:
        """Liveness: answers without touching the store and without a token."""
        return Response(m.HealthBody(version=__version__).model_dump_json(), media_type="application/json")

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition: queue depth per status, spans ingested, request latencies."""
        metrics.observe_store(await store.statistics())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.router.route_class = OrjsonRoute  # OTLP and dashboard endpoints: FastAPI's generic handling
    add_otlp_route(
        app,
        store,
        metrics=metrics,
        max_body_bytes=max_body_bytes,
        max_spans_per_request=max_spans_per_request,
    )
    add_otlp_logs_route(app, store, metrics=metrics, max_body_bytes=max_body_bytes, max_records=max_spans_per_request)
    app.state.metrics = metrics
    from agentlightning.dashboard import mount_dashboard  # on use: it pulls in the adapter, which importers skip

    mount_dashboard(app, store)  # pages at /, read-only JSON under /v1/dashboard
    return app


def _same_span(stored: Span, sent: Span) -> bool:
    # Field-by-field, ignoring the sequence id the store assigned (the sent span carries 0).
    return {**stored.__dict__, "sequence_id": 0} == {**sent.__dict__, "sequence_id": 0}


async def _claim_waiting(
    claim: Callable[[str | None], Awaitable[ClaimedRollout | None]],
    waker: _ClaimWaker,
    request: Request,
    worker_id: str | None,
    budget_s: float,
) -> ClaimedRollout | None:
    # Non-blocking claims in a loop instead of the store's own waiting claim: a claim made after the caller hung up
    # would leave a rollout claimed by nobody, so the disconnect check sits right before each claim.
    deadline = time.monotonic() + budget_s
    delay = 0.005
    while True:
        changed = waker.current()
        claimed = await claim(worker_id)
        remaining = deadline - time.monotonic()
        if claimed is not None or remaining <= 0:
            return claimed
        try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel (gh-86296)
            async with asyncio.timeout(min(delay, remaining)):
                await changed.wait()
        except TimeoutError:
            delay = min(delay * 2, _CLAIM_POLL_MAX_S)
        if await request.is_disconnected():
            return None


def _add_error_handlers(app: FastAPI) -> None:
    async def not_found(_: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=404, headers={m.ERROR_KIND_HEADER: "NotFoundError"})

    async def illegal(_: Request, exc: Exception) -> Response:
        headers = {m.ERROR_KIND_HEADER: "IllegalTransitionError"}
        return JSONResponse({"detail": str(exc)}, status_code=409, headers=headers)

    async def invalid(_: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": str(exc) or type(exc).__name__}, status_code=422)

    async def out_of_range(_: Request, exc: Exception) -> Response:
        detail = f"a number in the request is out of range (integers are stored in 64 bits): {exc}"
        return JSONResponse({"detail": detail}, status_code=422)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette's Allow names only the first route of the path; a path served by several (GET and POST
            # /v1/resources) gets every method of every route of that path.
            path = request.url.path
            allowed = sorted(
                {
                    method
                    for r in app.routes
                    if isinstance(r, APIRoute) and r.path_regex.match(path)
                    for method in r.methods or ()
                }
            )
            if allowed:
                kept = {k: v for k, v in (headers or {}).items() if k.lower() != "allow"}
                headers = {**kept, "allow": ", ".join(allowed)}
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    async def request_invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            reason = "; ".join(str(e.get("ctx", {}).get("error", "")) for e in errors)
            return JSONResponse({"detail": f"request body is not valid JSON: {reason}"}, status_code=400)
        return JSONResponse(
            {"detail": _describe_errors(errors), "errors": [_plain_error(e) for e in errors]}, status_code=422
        )

    app.add_exception_handler(NotFoundError, not_found)
    app.add_exception_handler(IllegalTransitionError, illegal)
    app.add_exception_handler(ValueError, invalid)
    app.add_exception_handler(OverflowError, out_of_range)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, request_invalid)


def _describe_errors(errors: Sequence[Any]) -> str:
    parts = [f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:10]]
    more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
    return "invalid request: " + "; ".join(parts) + more


def _plain_error(error: Any) -> dict[str, Any]:
    # The offending input is left out: it can be huge (a whole span batch) and is already known to the caller.
    loc: list[Any] = list(error.get("loc", ()))
    return {"loc": loc, "msg": str(error.get("msg", "")), "type": str(error.get("type", ""))}
