"""The dashboard's JSON endpoints under ``/v1/dashboard/…``: read-only views computed from the store."""

from __future__ import annotations

import time
from enum import Enum
from typing import Final

from fastapi import FastAPI, Query
from pydantic import BaseModel
from starlette.responses import Response

from agentlightning.adapter import TraceAdapter
from agentlightning.dashboard._curves import RunIndex, reward_curve
from agentlightning.dashboard._detail import adapt_attempt, rewards_of, span_nodes
from agentlightning.dashboard._digest import DigestCache, RolloutDigest
from agentlightning.dashboard._history import resource_versions, resources_id_of, worker_rows
from agentlightning.dashboard._models import (
    ResourcesHistory,
    RewardCurve,
    RolloutDetail,
    RolloutPage,
    RolloutRow,
    TrainingView,
    WorkersPage,
)
from agentlightning.dashboard._training import training_view
from agentlightning.store.base import LightningStore
from agentlightning.types import Rollout, RolloutMode, RolloutStatus

PREFIX: Final = "/v1/dashboard"
REFRESH_S: Final = 2.0
"""How often the pages poll for new data; shown in the page footer."""
# The agent filter reads each rollout's digest; past this many rollouts it stops and says so.
MAX_AGENT_SCAN: Final = 5_000
_SCAN_CHUNK: Final = 200
_MAX_OFFSET: Final = 10**9


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def add_dashboard_routes(app: FastAPI, store: LightningStore, adapter: TraceAdapter) -> None:
    """Register the dashboard's read-only endpoints on the store app (they share its auth and limits)."""
    cache = DigestCache(store)
    run = RunIndex(store, cache)
    tags: list[str | Enum] = ["dashboard"]

    async def versions() -> dict[str, int]:
        return {s.resources_id: s.version for s in await store.list_resources()}

    def row(rollout: Rollout, digest: RolloutDigest, version_of: dict[str, int]) -> RolloutRow:
        started, ended = rollout.start_time, rollout.end_time
        duration = None
        if started is not None:
            stop = ended if ended is not None else (None if rollout.is_terminal else time.time_ns())
            duration = None if stop is None else max(0.0, (stop - started) / 1e9)
        resources_id = resources_id_of(rollout, digest)
        latest = digest.latest
        return RolloutRow(
            rollout_id=rollout.rollout_id,
            status=rollout.status,
            mode=rollout.mode,
            group_id=rollout.group_id,
            attempts=rollout.num_attempts,
            reward=digest.reward,
            enqueue_ms=rollout.enqueue_time / 1e6,
            duration_s=duration,
            agents=sorted(digest.agents),
            spans=digest.spans,
            llm_calls=digest.llm_calls,
            worker_id=latest.worker_id if latest is not None else None,
            resources_version=version_of.get(resources_id) if resources_id else None,
        )

    @app.get(f"{PREFIX}/rollouts", response_model=RolloutPage, tags=tags)
    async def dashboard_rollouts(
        status: RolloutStatus | None = None,
        mode: RolloutMode | None = None,
        agent: str | None = Query(default=None, max_length=256, description="Only rollouts where this agent ran."),
        limit: int = Query(default=25, ge=1, le=200),
        offset: int = Query(default=0, ge=0, le=_MAX_OFFSET),
    ) -> Response:
        """A page of rollouts, newest first, with reward, agents, attempts and duration."""
        statuses: list[RolloutStatus] | None = [status] if status is not None else None
        capped = False
        if not agent:
            found = await store.query_rollouts(status=statuses, mode=mode, sort="desc", limit=limit + 1, offset=offset)
            page = found[:limit]
            digests = await cache.digests(page)
            has_more = len(found) > limit
        else:
            # No index knows which agents ran in a rollout: read digests newest first until the page is full.
            matches: list[tuple[Rollout, RolloutDigest]] = []
            scanned = 0
            while len(matches) <= offset + limit:
                chunk = await store.query_rollouts(
                    status=statuses, mode=mode, sort="desc", limit=_SCAN_CHUNK, offset=scanned
                )
                for rollout, digest in zip(chunk, await cache.digests(chunk), strict=True):
                    if agent in digest.agents:
                        matches.append((rollout, digest))
                scanned += len(chunk)
                if len(chunk) < _SCAN_CHUNK:
                    break
                if scanned >= MAX_AGENT_SCAN:
                    capped = True
                    break
            window = matches[offset : offset + limit]
            page, digests = [m[0] for m in window], [m[1] for m in window]
            has_more = len(matches) > offset + limit
        version_of = await versions()
        body = RolloutPage(
            rows=[row(r, d, version_of) for r, d in zip(page, digests, strict=True)],
            offset=offset,
            limit=limit,
            has_more=has_more,
            scan_capped=capped,
            agents=cache.agents,
            statistics=await store.statistics(),
            refresh_s=REFRESH_S,
        )
        return _json(body)

    @app.get(f"{PREFIX}/rollouts/{{rollout_id}}", response_model=RolloutDetail, tags=tags)
    async def dashboard_rollout(
        rollout_id: str,
        attempt_id: str | None = Query(default=None, max_length=256, description="Default: the latest attempt."),
        agents: str | None = Query(
            default=None, max_length=1024, description="Comma-separated agents to train (names, globs, re:...)."
        ),
        credit: str = Query(default="", max_length=128, description="Credit strategy; default: the server's."),
    ) -> Response:
        """One rollout with the span tree of an attempt and the transitions the adapter makes of it."""
        rollout = await store.get_rollout(rollout_id)
        attempts = await store.query_attempts(rollout_id)
        chosen = attempt_id or (attempts[-1].attempt_id if attempts else None)
        spans = await store.query_spans(rollout_id, chosen) if chosen else []
        used = adapter
        if agents or credit:
            names = [a.strip() for a in (agents or "").split(",") if a.strip()]
            used = TraceAdapter(
                agents=names or adapter.selector,
                credit=credit or adapter.credit,
                gamma=adapter.gamma,
                order=adapter.order,
                default_reward=adapter.default_reward,
                include_messages=False,
            )
        adapted = adapt_attempt(used, rollout, spans)
        t0, nodes = span_nodes(spans, adapted)
        attempt = next((a for a in attempts if a.attempt_id == chosen), None)
        resources_id = (attempt.resources_id if attempt else None) or rollout.resources_id
        body = RolloutDetail(
            rollout=rollout,
            attempts=attempts,
            attempt_id=chosen,
            t0_ms=t0,
            span_count=len(spans),
            spans=nodes,
            llm_calls=len(adapted.trace.calls) if adapted.trace else 0,
            transitions=len(adapted.transitions),
            rewards=rewards_of(adapted),
            credit=used.credit if isinstance(used.credit, str) else getattr(used.credit, "__name__", "custom"),
            agents=agents or None,
            adapter_error=adapted.error,
            resources_version=(await versions()).get(resources_id) if resources_id else None,
            refresh_s=REFRESH_S,
        )
        return _json(body)

    @app.get(f"{PREFIX}/resources", response_model=ResourcesHistory, tags=tags)
    async def dashboard_resources() -> Response:
        """Every resources snapshot, newest first, with its diff and how many rollouts of the run used it."""
        view = await run.view()
        snapshots = await store.list_resources()
        body = ResourcesHistory(
            versions=resource_versions(snapshots, view.usage), unread=view.unread, refresh_s=REFRESH_S
        )
        return _json(body)

    @app.get(f"{PREFIX}/curve", response_model=RewardCurve, tags=tags)
    async def dashboard_curve(
        points: bool = Query(default=False, description="Also return the raw reward of each rollout."),
    ) -> Response:
        """Reward per training step (resources version) and mode over the whole run: mean and standard error."""
        body = reward_curve(await run.view(), await versions(), with_points=points, refresh_s=REFRESH_S)
        return _json(body)

    @app.get(f"{PREFIX}/workers", response_model=WorkersPage, tags=tags)
    async def dashboard_workers(
        recent: int = Query(default=500, ge=1, le=10_000, description="Rollouts whose attempts are looked at."),
        silent_after_s: float = Query(default=30.0, gt=0, le=86_400),
    ) -> Response:
        """Workers (runners) seen in the attempts of the most recent rollouts, with their last heartbeat."""
        rollouts = await store.query_rollouts(sort="desc", limit=recent)
        rows = worker_rows(await cache.digests(rollouts), silent_after_s)
        body = WorkersPage(workers=rows, considered=len(rollouts), silent_after_s=silent_after_s, refresh_s=REFRESH_S)
        return _json(body)

    @app.get(f"{PREFIX}/training", response_model=TrainingView, tags=tags)
    async def dashboard_training(
        run_id: str | None = Query(default=None, max_length=256, description="Default: the latest run."),
    ) -> Response:
        """A training run's per-step metrics (reward, staleness, idle shares, durations) as its trainer stored them."""
        return _json(await training_view(store, run_id or None, REFRESH_S))
