"""Rollouts (task execution requests) and attempts (each try at one), with their state machines."""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

RolloutStatus: TypeAlias = Literal["queuing", "preparing", "running", "succeeded", "failed", "cancelled", "requeuing"]
AttemptStatus: TypeAlias = Literal["preparing", "running", "succeeded", "failed", "timeout", "unresponsive"]
RolloutMode: TypeAlias = Literal["train", "val", "test"]

ROLLOUT_TERMINAL: Final[frozenset[RolloutStatus]] = frozenset({"succeeded", "failed", "cancelled"})
ATTEMPT_TERMINAL: Final[frozenset[AttemptStatus]] = frozenset({"succeeded", "failed", "timeout", "unresponsive"})

# Legal rollout transitions. A rollout is claimable in queuing/requeuing; claiming moves it to preparing.
ROLLOUT_TRANSITIONS: Final[dict[RolloutStatus, frozenset[RolloutStatus]]] = {
    "queuing": frozenset({"preparing", "cancelled"}),
    "requeuing": frozenset({"preparing", "cancelled"}),
    "preparing": frozenset({"running", "succeeded", "failed", "requeuing", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "requeuing", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

# Legal attempt transitions.
ATTEMPT_TRANSITIONS: Final[dict[AttemptStatus, frozenset[AttemptStatus]]] = {
    "preparing": frozenset({"running", "succeeded", "failed", "timeout", "unresponsive"}),
    "running": frozenset({"succeeded", "failed", "timeout", "unresponsive"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "timeout": frozenset(),
    "unresponsive": frozenset(),
}


class RolloutConfig(BaseModel):
    """How long an attempt may run, how long it may stay silent, and when the rollout is retried."""

    model_config = ConfigDict(frozen=True)

    # allow_inf_nan=False: "inf" (a string pydantic would coerce) is no limit in disguise, and JSON cannot hold it.
    timeout_s: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Wall-clock limit of one attempt; None = none."
    )
    heartbeat_timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="An attempt silent (no span, no heartbeat) this long is unresponsive.",
    )
    max_attempts: int = Field(default=1, ge=1, description="Attempts allowed in total, the first included.")
    retry_on: tuple[AttemptStatus, ...] = Field(
        default=("timeout", "unresponsive"),
        description="Terminal attempt statuses after which the rollout is requeued while attempts remain.",
    )

    @model_validator(mode="after")
    def _retry_on_terminal(self) -> RolloutConfig:
        bad = [s for s in self.retry_on if s not in ATTEMPT_TERMINAL or s == "succeeded"]
        if bad:
            raise ValueError(f"retry_on may hold only failed, timeout, unresponsive; got {bad}")
        return self


class Rollout(BaseModel):
    """One request to run the agent on one task input."""

    rollout_id: str
    input: Any = Field(description="The task, as given to the agent. Must be JSON-serialisable.")
    mode: RolloutMode | None = None
    group_id: str | None = Field(
        default=None, description="Rollouts of the same task share a group (GRPO normalises within it)."
    )
    resources_id: str | None = Field(
        default=None, description="Resources snapshot to run with; None = the latest at claim time."
    )
    status: RolloutStatus = "queuing"
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    enqueue_time: int = Field(description="Nanoseconds since the Unix epoch.")
    start_time: int | None = Field(default=None, description="When the first attempt was claimed (ns).")
    end_time: int | None = Field(default=None, description="When the rollout reached a terminal status (ns).")
    num_attempts: int = 0

    @property
    def is_terminal(self) -> bool:
        """True once the rollout can no longer change."""
        return self.status in ROLLOUT_TERMINAL


class Attempt(BaseModel):
    """One try at running a rollout, owned by one worker."""

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(description="1 for the first attempt of the rollout, 2 for the retry, ...")
    status: AttemptStatus = "preparing"
    worker_id: str | None = None
    start_time: int = Field(description="When the attempt was claimed (ns).")
    end_time: int | None = None
    last_heartbeat_time: int | None = Field(default=None, description="Last heartbeat or span (ns).")
    error: str | None = Field(default=None, description="Why the attempt failed, when it did.")
    resources_id: str | None = Field(default=None, description="The resources snapshot the attempt ran with.")

    @property
    def is_terminal(self) -> bool:
        """True once the attempt can no longer change."""
        return self.status in ATTEMPT_TERMINAL


class RolloutRequest(BaseModel):
    """What a caller gives :meth:`LightningStore.enqueue_rollouts` for each rollout."""

    input: Any
    mode: RolloutMode | None = None
    group_id: str | None = None
    resources_id: str | None = None
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ClaimedRollout(BaseModel):
    """A rollout a worker has claimed, with the new attempt it must run."""

    rollout: Rollout
    attempt: Attempt
