"""Request and response bodies of the store's REST API (``/v1/…``); the client builds and parses the same models."""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

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

# Storage backends keep integers in 64 bits (SQLite, PostgreSQL BIGINT): larger numbers are rejected at the edge.
MAX_INT64: Final = 2**63 - 1

API_PREFIX: Final = "/v1"
IDEMPOTENCY_HEADER: Final = "idempotency-key"
# Names the store error class of a 404/409 answer, so the client raises the same type as a local store.
ERROR_KIND_HEADER: Final = "x-agentlightning-error"


class _Body(BaseModel):
    # Unknown fields are rejected so that a typo ("timeout" for "timeout_s") fails loudly instead of being ignored;
    # strict types, as the OpenAPI spec says them: `"start": 0` or `"timeout_s": false` is a 422, not a coercion.
    model_config = ConfigDict(extra="forbid", strict=True)


class EnqueueRolloutsBody(_Body):
    """Rollouts to enqueue, in order, in one transaction."""

    requests: list[RolloutRequest]


class ClaimRolloutBody(_Body):
    """Claim the oldest claimable rollout, waiting up to ``timeout_s`` (capped by the server's long-poll limit)."""

    worker_id: str | None = None
    timeout_s: float | None = Field(default=None, ge=0, le=86_400, description="Seconds to wait; None = no wait.")
    start: bool = Field(default=False, description="Also start the new attempt: rollout and attempt come back running.")


class FinishAttemptBody(_Body):
    """Terminal status of an attempt, with the error when it failed and optionally its last spans."""

    status: AttemptStatus
    error: str | None = None
    spans: list[Span] = Field(
        default_factory=list[Span], description="The attempt's last spans, stored before the status is recorded."
    )


class UpdateMetadataBody(_Body):
    """Keys to merge into a rollout's metadata."""

    metadata: dict[str, Any]


class AddSpansBody(_Body):
    """Spans to store in one transaction (idempotent on rollout, attempt and span id)."""

    spans: list[Span]


class QueryRolloutsBody(_Body):
    """Filters of :meth:`LightningStore.query_rollouts`; every given filter must match."""

    status: list[RolloutStatus] | None = None
    mode: RolloutMode | None = None
    rollout_ids: list[str] | None = None
    group_id: str | None = None
    sort: Literal["asc", "desc"] = "asc"
    limit: int | None = Field(default=None, ge=0, le=MAX_INT64)
    offset: int = Field(default=0, ge=0, le=MAX_INT64)


class WaitForRolloutsBody(_Body):
    """Wait until all given rollouts are terminal, up to ``timeout_s`` (capped by the server's long-poll limit)."""

    rollout_ids: list[str]
    timeout_s: float | None = Field(default=None, ge=0, le=86_400, description="Seconds to wait; None = no limit.")


class AddResourcesBody(_Body):
    """Named resources forming a new immutable snapshot."""

    resources: dict[str, Resource]


class CheckTimeoutsBody(_Body):
    """One watchdog tick at ``now`` (ns since the epoch; None = the store's clock)."""

    now: int | None = Field(default=None, ge=0, le=MAX_INT64)


class AddMetricsBody(_Body):
    """Per-step metrics records to store in one transaction (a stored ``(run_id, step)`` is replaced)."""

    records: list[MetricsRecord]


class StoredCount(BaseModel):
    """How many records a write stored."""

    stored: int


SpansAnswer: TypeAlias = Literal["spans", "sequence_ids"]


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of the REST API: a message saying what was wrong and how to fix it."""

    detail: str
    errors: list[dict[str, Any]] | None = Field(default=None, description="Field-level validation errors, if any.")


class HealthBody(BaseModel):
    """Liveness answer of ``GET /health``."""

    status: Literal["ok"] = "ok"
    version: str


# Adapters built once: pydantic compiles a validator/serializer per type, which is too slow to repeat per request.
ROLLOUT: Final = TypeAdapter(Rollout)
ROLLOUTS: Final = TypeAdapter(list[Rollout])
ATTEMPT: Final = TypeAdapter(Attempt)
ATTEMPTS: Final = TypeAdapter(list[Attempt])
SPANS: Final = TypeAdapter(list[Span])
SEQUENCE_IDS_OR_SPANS: Final = TypeAdapter(list[int | Span])
CLAIMED: Final = TypeAdapter(ClaimedRollout | None)
SNAPSHOT: Final = TypeAdapter(ResourcesSnapshot)
SNAPSHOT_OR_NONE: Final = TypeAdapter(ResourcesSnapshot | None)
SNAPSHOTS: Final = TypeAdapter(list[ResourcesSnapshot])
REQUESTS: Final = TypeAdapter(list[RolloutRequest])
RESOURCES: Final = TypeAdapter(dict[str, Resource])
METRICS: Final = TypeAdapter(list[MetricsRecord])
METRIC_RUNS: Final = TypeAdapter(list[MetricsRun])
