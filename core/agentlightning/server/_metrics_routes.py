"""The algorithm-metrics routes of the store app: ``POST /v1/metrics``, ``GET /v1/metrics``, ``GET /v1/metrics/runs``.

Registered by :func:`~agentlightning.server._app.create_app` among the other store endpoints, so they share its
bearer-token check, body size limit, orjson parsing (a NaN or Infinity in a body is a 400 naming where it is) and
error answers (a store ValueError is a 422 with the store's message).
"""

from __future__ import annotations

from enum import Enum

from fastapi import FastAPI, Query
from starlette.exceptions import HTTPException
from starlette.responses import Response

from agentlightning import _wire as m
from agentlightning.store.base import LightningStore
from agentlightning.types import MetricsRecord, MetricsRun

__all__ = ["add_metrics_routes"]


def add_metrics_routes(app: FastAPI, store: LightningStore, *, max_records: int) -> None:
    """Serve the store's metrics operations; a POST of more than ``max_records`` records is refused with 413."""
    v1 = m.API_PREFIX
    tags: list[str | Enum] = ["metrics"]

    @app.post(f"{v1}/metrics", response_model=m.StoredCount, tags=tags)
    async def add_metrics(body: m.AddMetricsBody) -> Response:
        """Store per-step metrics of training runs; a record of a stored ``(run_id, step)`` replaces it.

        Idempotent, so a retry needs no idempotency key. Two records of one ``(run_id, step)`` in a body are refused
        (422), as is any value that is not a finite number.
        """
        if len(body.records) > max_records:
            raise HTTPException(
                413,
                f"{len(body.records)} metrics records in one request; this server accepts at most {max_records} "
                "(max_spans_per_request). Send them in smaller batches.",
            )
        await store.add_metrics(body.records)
        return Response(m.StoredCount(stored=len(body.records)).model_dump_json(), media_type="application/json")

    @app.get(f"{v1}/metrics", response_model=list[MetricsRecord], tags=tags)
    async def query_metrics(
        run_id: str | None = Query(default=None, min_length=1, max_length=256, description="None: every run."),
        after_step: int | None = Query(default=None, ge=0, le=m.MAX_INT64, description="Only steps after it."),
        limit: int | None = Query(default=None, ge=0, le=m.MAX_INT64),
    ) -> Response:
        """Metrics records ordered by ``(run_id, step)``; an unknown run has none (an empty list)."""
        records = await store.query_metrics(run_id, after_step=after_step, limit=limit)
        return Response(m.METRICS.dump_json(records), media_type="application/json")

    @app.get(f"{v1}/metrics/runs", response_model=list[MetricsRun], tags=tags)
    async def list_metric_runs() -> Response:
        """Every run with metrics, the most recently written first."""
        return Response(m.METRIC_RUNS.dump_json(await store.list_metric_runs()), media_type="application/json")
