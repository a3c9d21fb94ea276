"""The one data model used everywhere: spans, rollouts, attempts, resources, transitions, algorithm metrics."""

from agentlightning.types.metrics import MetricsRecord, MetricsRun
from agentlightning.types.resources import LLM, PromptTemplate, Resource, ResourcesSnapshot
from agentlightning.types.rollouts import (
    ATTEMPT_TERMINAL,
    ATTEMPT_TRANSITIONS,
    ROLLOUT_TERMINAL,
    ROLLOUT_TRANSITIONS,
    Attempt,
    AttemptStatus,
    ClaimedRollout,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
)
from agentlightning.types.spans import (
    Attributes,
    AttributeValue,
    Span,
    SpanEvent,
    SpanKind,
    SpanLink,
    SpanStatus,
    StatusCode,
)
from agentlightning.types.transitions import Transition

__all__ = [
    "ATTEMPT_TERMINAL",
    "ATTEMPT_TRANSITIONS",
    "LLM",
    "ROLLOUT_TERMINAL",
    "ROLLOUT_TRANSITIONS",
    "Attempt",
    "AttemptStatus",
    "AttributeValue",
    "Attributes",
    "ClaimedRollout",
    "MetricsRecord",
    "MetricsRun",
    "PromptTemplate",
    "Resource",
    "ResourcesSnapshot",
    "Rollout",
    "RolloutConfig",
    "RolloutMode",
    "RolloutRequest",
    "RolloutStatus",
    "Span",
    "SpanEvent",
    "SpanKind",
    "SpanLink",
    "SpanStatus",
    "StatusCode",
    "Transition",
]
