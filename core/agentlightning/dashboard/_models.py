"""Response bodies of the dashboard's JSON endpoints (``/v1/dashboard/…``); times are milliseconds since the epoch.

Milliseconds (floats), not the store's integer nanoseconds: JavaScript numbers hold integers exactly only up to
2**53, and nanoseconds since 1970 are already past 2**60.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, Field

from agentlightning.store.base import StoreStatistics
from agentlightning.types import Attempt, Rollout, RolloutMode, RolloutStatus

SpanKindLabel: TypeAlias = Literal["agent", "llm", "tool", "reward", "other"]
WorkerState: TypeAlias = Literal["busy", "idle", "silent"]


class RolloutRow(BaseModel):
    """One line of the rollouts table."""

    rollout_id: str
    status: RolloutStatus
    mode: RolloutMode | None
    group_id: str | None
    attempts: int
    reward: float | None = Field(description="Primary value of the latest attempt's last reward span.")
    enqueue_ms: float
    duration_s: float | None = Field(description="End (or now, while running) minus the first claim.")
    agents: list[str] = Field(description="gen_ai.agent.name values seen on the latest attempt's spans.")
    spans: int
    llm_calls: int
    worker_id: str | None
    resources_version: int | None


class RolloutPage(BaseModel):
    """A page of the rollouts table with what the filter bar and the header need."""

    rows: list[RolloutRow]
    offset: int
    limit: int
    has_more: bool
    scan_capped: bool = Field(description="True when the agent filter stopped scanning before the oldest rollout.")
    agents: list[str] = Field(description="Every agent name seen so far, for the agent filter.")
    statistics: StoreStatistics
    refresh_s: float


class Message(BaseModel):
    """One chat message as recorded in ``gen_ai.*.messages`` (OpenAI chat shape), content flattened to text."""

    role: str
    content: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list[dict[str, Any]])
    tool_call_id: str | None = None


class SpanNode(BaseModel):
    """One span of the tree, in depth-first order, with what the adapter made of it."""

    span_id: str
    parent_id: str | None
    depth: int
    orphan: bool = Field(description="Its parent_id names a span that never reached the store.")
    name: str
    kind: SpanKindLabel
    sequence_id: int
    start_ms: float = Field(description="Offset from the attempt's first span start.")
    duration_ms: float | None
    status: str
    status_message: str | None
    agent_name: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    prompt_token_ids: int = Field(description="Number of engine prompt token ids recorded (0 = none).")
    response_token_ids: int
    system: str | None
    input_messages: list[Message]
    output_messages: list[Message]
    tool_name: str | None
    tool_arguments: str | None
    tool_result: str | None
    reward: float | None
    reward_dimensions: dict[str, float]
    turn_index: int | None = Field(description="The LLM call's position among the attempt's calls.")
    twin_of: str | None = Field(description="A proxy/hook twin merged into the call of this span id.")
    selected: bool = Field(description="The call belongs to an agent the adapter trains.")
    transition: bool = Field(description="The call became a training transition.")
    credit: float | None = Field(description="The transition's reward after credit assignment.")
    attributes: dict[str, Any]
    events: list[dict[str, Any]]


class RewardInfo(BaseModel):
    """One reward of the attempt, placed among its LLM calls."""

    span_id: str | None
    value: float
    after_calls: int
    is_final: bool
    dimensions: dict[str, float]


class RolloutDetail(BaseModel):
    """A rollout, its attempts and the span tree of one attempt with the adapter's transitions."""

    rollout: Rollout
    attempts: list[Attempt]
    attempt_id: str | None = Field(description="The attempt whose spans are shown.")
    t0_ms: float | None = Field(description="Start of the attempt's first span; span offsets count from it.")
    span_count: int
    spans: list[SpanNode]
    llm_calls: int
    transitions: int
    rewards: list[RewardInfo]
    credit: str
    agents: str | None = Field(description="The agent selection the transitions were computed with (None = all).")
    adapter_error: str | None
    resources_version: int | None
    refresh_s: float


class FieldChange(BaseModel):
    """One field of a resource that differs from the previous snapshot, values rendered as text."""

    field: str
    before: str
    after: str


class ResourceItem(BaseModel):
    """One named resource of a snapshot, with what changed since the previous snapshot."""

    name: str
    kind: str
    changed: bool
    added: bool
    template: str | None = None
    engine: str | None = None
    diff: list[str] = Field(default_factory=list[str], description="Unified diff of the template, when changed.")
    model: str | None = None
    base_url: str | None = None
    weights_version: int | None = None
    sampling: dict[str, Any] = Field(default_factory=dict[str, Any])
    field_changes: list[FieldChange] = Field(
        default_factory=list[FieldChange], description="Fields that differ from the previous snapshot's resource."
    )


class ResourceVersion(BaseModel):
    """One resources snapshot."""

    resources_id: str
    version: int
    create_ms: float
    items: list[ResourceItem]
    removed: list[str]
    rollouts: int = Field(description="Every rollout of the store that ran (or is queued to run) with it.")
    changed: list[str] = Field(description="Names of the resources added or changed since the previous snapshot.")


class ResourcesHistory(BaseModel):
    """Every snapshot, newest first."""

    versions: list[ResourceVersion]
    unread: int = Field(description="Rollouts not counted yet (a first look at a long run reads it in parts).")
    refresh_s: float


class CurveStep(BaseModel):
    """The rewards of one series at one training step (resources version), over the whole run."""

    version: int | None = Field(description="The snapshot's version; None = no (or an unknown) snapshot.")
    count: int
    mean: float
    stderr: float = Field(description="Standard error of the mean; the band is mean ± stderr.")
    low: float
    high: float


class CurveSeries(BaseModel):
    """One mode's (train, val, test or none) per-step rewards, oldest step first."""

    mode: str
    rollouts: int
    steps: list[CurveStep]


class CurvePoint(BaseModel):
    """The reward of one finished rollout (raw-points view)."""

    rollout_id: str
    mode: str
    status: RolloutStatus
    reward: float
    resources_version: int | None


class RewardCurve(BaseModel):
    """Per-step reward statistics of every finished rollout, and raw points on request."""

    series: list[CurveSeries]
    band: str = Field(description="What the shaded band around each mean shows, as the page labels it.")
    rewarded: int = Field(description="Finished rollouts with a reward in the statistics.")
    scanned: int = Field(description="Rollouts read so far (all of them unless unread > 0).")
    unread: int = Field(description="Rollouts not read yet: the statistics are partial until it is 0.")
    points: list[CurvePoint] = Field(description="Raw points; empty unless asked for.")
    points_total: int = Field(description="Rewarded rollouts the raw points stand for.")
    points_stride: int = Field(description="1 = every raw point; k = every k-th rollout of a long series.")
    refresh_s: float


class WorkerRow(BaseModel):
    """A runner as seen through the attempts it claimed."""

    worker_id: str
    state: WorkerState
    attempts: int
    running: int
    succeeded: int
    failed: int
    last_heartbeat_ms: float | None
    current_rollouts: list[str]
    last_rollout_id: str | None


class WorkersPage(BaseModel):
    """Workers seen in the attempts of the most recent rollouts."""

    workers: list[WorkerRow]
    considered: int
    silent_after_s: float
    refresh_s: float


class TrainingRun(BaseModel):
    """A training run with metrics in the store (the run selector's entries)."""

    run_id: str
    steps: int
    first_step: int
    last_step: int
    last_ms: float = Field(description="When its latest step was written.")


class TrainingStep(BaseModel):
    """The series the Training view draws, at one step; None where the trainer did not report the value."""

    step: int
    time_ms: float
    reward_mean: float | None
    reward_ema: float | None
    val_reward: float | None = Field(default=None, description="Greedy validation reward, at steps that validated.")
    runner_idle_frac: float | None
    learner_idle_frac: float | None
    rollout_s: float | None
    update_s: float | None
    policy_version: float | None
    staleness: list[float] = Field(description="Trained transitions by versions behind: index 0 = current policy.")
    stale_groups_dropped: float
    stale_rollouts_dropped: float


class TrainingView(BaseModel):
    """One run's per-step metrics as the trainer wrote them to the store, oldest step first."""

    runs: list[TrainingRun] = Field(description="Every run with metrics, the most recently written first.")
    run_id: str | None = Field(description="The run shown: the one asked for, else the latest; None = no metrics.")
    steps: list[TrainingStep]
    earlier: int = Field(description="Earlier steps of the run left out (the view keeps the latest ones).")
    latest: dict[str, float] = Field(description="Every value of the last step shown, by name.")
    refresh_s: float
