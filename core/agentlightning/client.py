"""LightningStoreClient: a :class:`LightningStore` backed by a store server, so code does not care where the store is.

Usable from any number of event loops and threads (one connection pool per running loop: a lean HTTP/1.1 pool for
``http://`` URLs, ``httpx`` for ``https://`` and custom transports); wrap it in
:class:`agentlightning.store.SyncLightningStore` for blocking use. Connection errors and 5xx answers are retried
with exponential backoff; every operation is safe to retry (span and metrics ingest are idempotent, and enqueue,
claim, start, finish, cancel and add-resources carry an ``Idempotency-Key``, stored by the server with the write, so
a retry acts once even across a server restart). A 4xx raises the same error
type as a local store (NotFoundError, IllegalTransitionError, ValueError) with the server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import random
import ssl
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Final, Literal, NoReturn
from urllib.parse import quote, urlencode, urlsplit

import httpx
import orjson
from pydantic import TypeAdapter

from agentlightning import _wire as m
from agentlightning._http11 import Answer, Http11Pool, TransportFailure
from agentlightning.store._keys import check_key
from agentlightning.store._metrics import checked_query, checked_records
from agentlightning.store.base import (
    IllegalTransitionError,
    LightningStore,
    NotFoundError,
    SortOrder,
    StoreError,
    StoreStatistics,
)
from agentlightning.types import (
    Attempt,
    AttemptStatus,
    ClaimedRollout,
    MetricsRecord,
    MetricsRun,
    Resource,
    ResourcesSnapshot,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
)

_METADATA: Final = TypeAdapter(dict[str, Any])
_JSON_HEADERS: Final = {"content-type": "application/json"}


# httpcore's pool scans every connection (polling idle sockets) for each request, so its cost per request grows
# with the pool; 32 busy workers on one pool spent most of their CPU there. Small pools behind one client fix that.
_SHARDS: Final = 8


_Sender = httpx.AsyncClient | Http11Pool


TOKEN_ENV: Final = "AGENTLIGHTNING_TOKEN"
"""Environment variable a client takes its bearer token from when none is passed (what `agl store --token` sets)."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store server could not be reached, or kept failing (5xx), after all retries."""


class LightningStoreClient(LightningStore):
    """The store at ``url`` (e.g. ``http://127.0.0.1:4747``), with the interface of every local backend."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 5,
        backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
        long_poll_s: float = 20.0,
        max_connections: int = 256,
        transport_factory: Callable[[], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        """Point at a store server; ``timeout_s`` bounds each request beyond any wait it asks the server for.

        ``token`` defaults to the ``AGENTLIGHTNING_TOKEN`` environment variable (pass ``""`` to send none).

        ``transport_factory`` makes the httpx transport of each event loop (e.g. ``httpx.ASGITransport`` to talk
        to an app in process); by default connections are pooled TCP.
        """
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"store url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        # Below the server's default wait cap (30 s), so a long poll ends on the server, never on a client timeout.
        self.long_poll_s = long_poll_s
        if token is None:
            token = os.environ.get(TOKEN_ENV)
        token = token or None
        self.token = token  # what another process needs to reach the same server (Trainer(runner_processes=))
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._shards = max(1, min(_SHARDS, max_connections))
        per_shard = -(-max_connections // self._shards)
        self._limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        self._transport_factory = transport_factory
        self._lock = threading.Lock()
        self._max_connections = max_connections
        parsed = urlsplit(self.url)
        # Plain HTTP goes through the lean pool (see agentlightning._http11); TLS and custom transports use httpx.
        plain = parsed.scheme == "http" and parsed.hostname is not None and transport_factory is None
        self._plain = (parsed.hostname or "", parsed.port or 80) if plain else None
        self._base_path = parsed.path
        self._clients: dict[asyncio.AbstractEventLoop, tuple[_Sender, AsyncGenerator[None, None]]] = {}

    def __repr__(self) -> str:
        return f"LightningStoreClient({self.url!r})"

    # --- transport -------------------------------------------------------------------------------------------------
    async def _client(self) -> _Sender:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is not None:
            return entry[0]
        client: _Sender
        if self._plain is not None:
            client = Http11Pool(self._plain[0], self._plain[1], max_connections=self._max_connections)
        else:
            if self._transport_factory is not None:
                transport = self._transport_factory()
            else:
                transport = _ShardedTransport(self._limits, self._shards)
            client = httpx.AsyncClient(
                base_url=self.url, headers=self._headers, limits=self._limits, timeout=None, transport=transport
            )
        closer = _close_with_loop(client)
        # First step registers the generator with the loop: asyncio.run() (and SyncLightningStore.close via
        # shutdown_asyncgens) then closes the pool when the loop ends, instead of leaking its sockets.
        await closer.__anext__()
        with self._lock:
            stale = [lp for lp in self._clients if lp.is_closed()]
            for lp in stale:
                del self._clients[lp]
            existing = self._clients.get(loop)
            if existing is None:
                self._clients[loop] = (client, closer)
        if existing is not None:  # another task of this loop got there first during the await above
            await closer.aclose()
            return existing[0]
        return client

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        keyed: bool = False,
        key: str | None = None,
        wait_s: float = 0.0,
    ) -> Answer:
        client = await self._client()
        headers = dict(_JSON_HEADERS) if body is not None else {}
        if keyed:
            # The same key on every retry of this call; the server stores it with the write, so a retry acts once
            # even when the server was restarted in between.
            check_key(key)
            headers[m.IDEMPOTENCY_HEADER] = uuid.uuid4().hex if key is None else key
        timeout = self.timeout_s + wait_s
        failure = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + random.random() / 2))  # jitter: retrying workers spread out
            try:
                if isinstance(client, Http11Pool):
                    target = self._base_path + path + (f"?{urlencode(params)}" if params else "")
                    # Every store operation acts once when repeated (keyed, or idempotent by id): this loop re-sends
                    # all of them, so the pool may re-send at once on a fresh connection too.
                    merged = {**self._headers, **headers}
                    response = await client.request(method, target, merged, body, timeout, replayable=True)
                else:
                    response = await _send_httpx(client, method, self.url + path, body, params, headers, timeout)
            except (httpx.TransportError, TransportFailure) as exc:  # connect/read errors and timeouts
                failure = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code < 300:
                return response
            if response.status_code < 500:
                _raise_client_error(response, method, path, self.url)
            failure = f"HTTP {response.status_code}: {_detail(response)}"
        raise StoreUnavailableError(
            f"store server at {self.url} failed {method} {path} after {self.max_retries + 1} tries ({failure}); "
            "check that it is running (agl store) and reachable"
        )

    # --- rollout queue -------------------------------------------------------------------------------------------
    async def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Enqueue rollouts in the given order (one transaction); returns them with ids, status ``queuing``."""
        body = b'{"requests":' + m.REQUESTS.dump_json(list(requests)) + b"}"
        response = await self._request("POST", "/v1/rollouts", body=body, keyed=True, key=idempotency_key)
        return m.ROLLOUTS.validate_json(response.content)

    async def claim_rollout(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout, long-polling the server up to ``timeout_s``."""
        return await self._claim(worker_id, timeout_s, start=False, key=idempotency_key)

    async def claim_and_start(
        self, worker_id: str | None = None, *, timeout_s: float | None = None, idempotency_key: str | None = None
    ) -> ClaimedRollout | None:
        """Claim the oldest claimable rollout and start its attempt, in one request (long-polling like a claim)."""
        return await self._claim(worker_id, timeout_s, start=True, key=idempotency_key)

    async def _claim(
        self, worker_id: str | None, timeout_s: float | None, *, start: bool, key: str | None
    ) -> ClaimedRollout | None:
        key = uuid.uuid4().hex if key is None else key  # one key for all the long polls of this call: one claims
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = None if remaining is None else min(remaining, self.long_poll_s)
            body = orjson.dumps({"worker_id": worker_id, "timeout_s": wait, "start": start})
            response = await self._request(
                "POST", "/v1/rollouts/claim", body=body, keyed=True, key=key, wait_s=wait or 0.0
            )
            claimed = m.CLAIMED.validate_json(response.content)
            if claimed is not None or deadline is None or time.monotonic() >= deadline:
                return claimed

    async def start_attempt(self, rollout_id: str, attempt_id: str, *, idempotency_key: str | None = None) -> Attempt:
        """Mark a claimed attempt (and its rollout) ``running``."""
        path = f"{_attempt_path(rollout_id, attempt_id)}/start"
        response = await self._request("POST", path, keyed=True, key=idempotency_key)
        return m.ATTEMPT.validate_json(response.content)

    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Record an attempt's terminal status and move the rollout accordingly."""
        body = orjson.dumps({"status": status, "error": error})
        path = f"{_attempt_path(rollout_id, attempt_id)}/finish"
        response = await self._request("POST", path, body=body, keyed=True, key=idempotency_key)
        return m.ATTEMPT.validate_json(response.content)

    async def finish_attempt_with_spans(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        spans: Sequence[Span],
        *,
        error: str | None = None,
        idempotency_key: str | None = None,
    ) -> Attempt:
        """Store an attempt's last spans, then record its terminal status, in one request."""
        _refuse_nonfinite(spans)
        head = orjson.dumps({"status": status, "error": error})
        body = head[:-1] + b',"spans":' + m.SPANS.dump_json(list(spans)) + b"}"
        path = f"{_attempt_path(rollout_id, attempt_id)}/finish"
        response = await self._request("POST", path, body=body, keyed=True, key=idempotency_key)
        return m.ATTEMPT.validate_json(response.content)

    async def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        """Cancel a non-terminal rollout."""
        path = f"{_rollout_path(rollout_id)}/cancel"
        response = await self._request("POST", path, keyed=True, key=idempotency_key)
        return m.ROLLOUT.validate_json(response.content)

    async def update_rollout_metadata(self, rollout_id: str, metadata: Mapping[str, Any]) -> Rollout:
        """Merge keys into a rollout's metadata."""
        body = b'{"metadata":' + _METADATA.dump_json(dict(metadata)) + b"}"
        response = await self._request("PATCH", f"{_rollout_path(rollout_id)}/metadata", body=body)
        return m.ROLLOUT.validate_json(response.content)

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Prove an attempt is alive."""
        response = await self._request("POST", f"{_attempt_path(rollout_id, attempt_id)}/heartbeat")
        return m.ATTEMPT.validate_json(response.content)

    # --- spans ---------------------------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans (one transaction, idempotent) and return them with their ``sequence_id``."""
        sent = list(spans)
        _refuse_nonfinite(sent)
        body = b'{"spans":' + m.SPANS.dump_json(sent) + b"}"
        response = await self._request("POST", "/v1/spans", body=body, params={"response": "sequence_ids"})
        # The server answers a sequence id for each span stored as sent, so the spans are not parsed back here.
        answer: list[Any] = orjson.loads(response.content)
        if len(answer) != len(sent):
            raise StoreError(
                f"store server answered {len(answer)} items for {len(sent)} spans; is it the same version?"
            )
        return [
            span.model_copy(update={"sequence_id": item}) if isinstance(item, int) else Span.model_validate(item)
            for span, item in zip(sent, answer, strict=True)
        ]

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Spans of a rollout ordered by (attempt sequence, span sequence_id)."""
        params: dict[str, Any] = {"after_sequence_id": after_sequence_id, "offset": offset}
        for key, value in (("attempt_id", attempt_id), ("name", name), ("limit", limit)):
            if value is not None:
                params[key] = value
        response = await self._request("GET", f"{_rollout_path(rollout_id)}/spans", params=params)
        return m.SPANS.validate_json(response.content)

    # --- queries -------------------------------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; NotFoundError if unknown."""
        response = await self._request("GET", _rollout_path(rollout_id))
        return m.ROLLOUT.validate_json(response.content)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        group_id: str | None = None,
        sort: SortOrder = "asc",
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts matching all given filters, ordered by enqueue order."""
        query = {
            "status": None if status is None else list(status),
            "mode": mode,
            "rollout_ids": None if rollout_ids is None else list(rollout_ids),
            "group_id": group_id,
            "sort": sort,
            "limit": limit,
            "offset": offset,
        }
        response = await self._request("POST", "/v1/rollouts/query", body=orjson.dumps(query))
        return m.ROLLOUTS.validate_json(response.content)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, oldest first; NotFoundError if the rollout is unknown."""
        response = await self._request("GET", f"{_rollout_path(rollout_id)}/attempts")
        return m.ATTEMPTS.validate_json(response.content)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Wait until every given rollout is terminal or the timeout passes; returns those that are terminal."""
        ids = list(rollout_ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = self.long_poll_s if deadline is None else max(0.0, deadline - time.monotonic())
            wait = min(remaining, self.long_poll_s)
            body = orjson.dumps({"rollout_ids": ids, "timeout_s": wait})
            response = await self._request("POST", "/v1/rollouts/wait", body=body, wait_s=wait)
            done = m.ROLLOUTS.validate_json(response.content)
            if len(done) == len(ids) or (deadline is not None and time.monotonic() >= deadline):
                return done

    # --- resources -----------------------------------------------------------------------------------------------
    async def add_resources(
        self, resources: Mapping[str, Resource], *, idempotency_key: str | None = None
    ) -> ResourcesSnapshot:
        """Store a new immutable snapshot; it becomes the latest."""
        body = b'{"resources":' + m.RESOURCES.dump_json(dict(resources)) + b"}"
        response = await self._request("POST", "/v1/resources", body=body, keyed=True, key=idempotency_key)
        return m.SNAPSHOT.validate_json(response.content)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesSnapshot | None:
        """A snapshot by id (NotFoundError if unknown), or the latest when id is None (None if there is none)."""
        if resources_id is None:
            response = await self._request("GET", "/v1/resources/latest")
            return m.SNAPSHOT_OR_NONE.validate_json(response.content)
        response = await self._request("GET", f"/v1/resources/{_segment(resources_id)}")
        return m.SNAPSHOT.validate_json(response.content)

    async def list_resources(self) -> list[ResourcesSnapshot]:
        """All snapshots, oldest first."""
        response = await self._request("GET", "/v1/resources")
        return m.SNAPSHOTS.validate_json(response.content)

    # --- algorithm metrics ---------------------------------------------------------------------------------------
    async def add_metrics(self, records: Sequence[MetricsRecord]) -> None:
        """Store per-step metrics (one transaction), replacing records of the same ``(run_id, step)``.

        Retried without an idempotency key, like span ingest: writing a step again stores the same record.
        """
        checked_records(records)  # the stores' own errors (NaN, duplicates) before sending, not a 400 on JSON paths
        sent = list(records)
        if sent:
            await self._request("POST", "/v1/metrics", body=b'{"records":' + m.METRICS.dump_json(sent) + b"}")

    async def query_metrics(
        self, run_id: str | None = None, *, after_step: int | None = None, limit: int | None = None
    ) -> list[MetricsRecord]:
        """Metrics records ordered by ``(run_id, step)``; an unknown run has none."""
        checked_query(run_id, after_step, limit)
        params = {k: v for k, v in (("run_id", run_id), ("after_step", after_step), ("limit", limit)) if v is not None}
        response = await self._request("GET", "/v1/metrics", params=params)
        return m.METRICS.validate_json(response.content)

    async def list_metric_runs(self) -> list[MetricsRun]:
        """Every run with metrics, the most recently written first."""
        response = await self._request("GET", "/v1/metrics/runs")
        return m.METRIC_RUNS.validate_json(response.content)

    # --- operations ----------------------------------------------------------------------------------------------
    async def check_timeouts(self, now: int | None = None) -> list[Attempt]:
        """Run one watchdog tick on the server; returns the attempts it changed."""
        response = await self._request("POST", "/v1/watchdog/check", body=orjson.dumps({"now": now}))
        return m.ATTEMPTS.validate_json(response.content)

    async def statistics(self) -> StoreStatistics:
        """Counts per status, spans and bytes."""
        response = await self._request("GET", "/v1/statistics")
        return StoreStatistics.model_validate_json(response.content)

    async def close(self) -> None:
        """Close the connection pools of every loop this client was used from (the server keeps running)."""
        with self._lock:
            entries = list(self._clients.items())
            self._clients.clear()
        current = asyncio.get_running_loop()
        for loop, (_, closer) in entries:
            if loop is current:
                await closer.aclose()
            elif not loop.is_closed():
                with contextlib.suppress(RuntimeError, TimeoutError):  # that loop stopped meanwhile
                    future = asyncio.run_coroutine_threadsafe(closer.aclose(), loop)
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=5.0)


class _ShardedTransport(httpx.AsyncBaseTransport):
    """Round-robin over a few small connection pools (see ``_SHARDS``)."""

    def __init__(self, limits: httpx.Limits, shards: int) -> None:
        verify = _ssl_context()
        self._pools = [httpx.AsyncHTTPTransport(limits=limits, verify=verify) for _ in range(shards)]
        self._next = itertools.cycle(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send on the next pool."""
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self._pools:
            await pool.aclose()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs ~50 ms of CPU; httpx would do it for every pool of every event loop.
    return ssl.create_default_context()


async def _close_with_loop(client: _Sender) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.aclose()


def _segment(value: str) -> str:
    # Ids are opaque to the client: quote everything, so "a/b" or "?" cannot change the route.
    return quote(value, safe="")


def _rollout_path(rollout_id: str) -> str:
    return f"/v1/rollouts/{_segment(rollout_id)}"


def _attempt_path(rollout_id: str, attempt_id: str) -> str:
    return f"{_rollout_path(rollout_id)}/attempts/{_segment(attempt_id)}"


async def _send_httpx(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    body: bytes | None,
    params: Mapping[str, Any] | None,
    headers: dict[str, str],
    timeout_s: float,
) -> Answer:
    # The absolute url: httpx parses it once instead of parsing and merging it with base_url.
    response = await client.request(method, url, content=body, params=params, headers=headers, timeout=timeout_s)
    return Answer(response.status_code, response.headers, response.content)


def _detail(response: Answer) -> str:
    text = response.content[:500].decode("utf-8", "replace")
    try:
        payload = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return text or f"HTTP {response.status_code}"
    if isinstance(payload, dict) and "detail" in payload:
        return str(payload["detail"])  # pyright: ignore[reportUnknownArgumentType] -- JSON object
    return text


def _raise_client_error(response: Answer, method: str, path: str, url: str) -> NoReturn:
    detail = _detail(response)
    code = response.status_code
    kind = response.headers.get(m.ERROR_KIND_HEADER)
    if kind == "NotFoundError":
        raise NotFoundError(detail)
    if kind == "IllegalTransitionError":
        raise IllegalTransitionError(detail)
    if code in (401, 403):
        raise PermissionError(f"store server at {urlsplit(url).hostname} refused {method} {path}: {detail}")
    if code == 404 and kind is None:
        raise NotFoundError(
            f"{detail}: {method} {path} matches no route of the server at {urlsplit(url).hostname} "
            "(an empty id, or not an Agent Lightning store server of this version)"
        )
    if code == 409:
        raise IllegalTransitionError(detail)
    raise ValueError(detail)


def _refuse_nonfinite(spans: Sequence[Span]) -> None:
    """Raise the stores' own error for a NaN/Infinity before sending: serialised, it would become ``null`` and the
    server's answer would be a list of type errors instead of naming the value."""
    from agentlightning.store._finite import nonfinite_span_error, span_has_nonfinite

    for index, span in enumerate(spans):
        if span_has_nonfinite(span):
            raise nonfinite_span_error(span, index)
