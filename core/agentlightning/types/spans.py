"""The span model: OpenTelemetry-shaped, plus rollout/attempt ids and a store-assigned sequence id.

Timestamps everywhere in Agent Lightning are integers, nanoseconds since the Unix epoch (as OpenTelemetry keeps
them, so conversions are lossless). Durations are float seconds and their names end in ``_s``.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

AttributeValue: TypeAlias = str | bool | int | float | list[str] | list[bool] | list[int] | list[float]
Attributes: TypeAlias = dict[str, AttributeValue]
SpanKind: TypeAlias = Literal["INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
StatusCode: TypeAlias = Literal["UNSET", "OK", "ERROR"]


class SpanStatus(BaseModel):
    """Outcome of a span, as in OpenTelemetry."""

    model_config = ConfigDict(frozen=True)

    code: StatusCode = "UNSET"
    message: str | None = None


class SpanEvent(BaseModel):
    """A timestamped event inside a span (an exception, a handoff, ...)."""

    name: str
    timestamp: int = Field(description="Nanoseconds since the Unix epoch.")
    attributes: Attributes = Field(default_factory=dict)


class SpanLink(BaseModel):
    """A link from one span to another span, possibly in another trace."""

    trace_id: str
    span_id: str
    attributes: Attributes = Field(default_factory=dict)


class Span(BaseModel):
    """One finished span of one attempt of one rollout."""

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(
        default=0, description="Assigned by the store on ingest: monotonic per attempt, starting at 1; 0 = not stored."
    )
    trace_id: str = Field(description="32 lowercase hex digits.")
    span_id: str = Field(description="16 lowercase hex digits.")
    parent_id: str | None = Field(default=None, description="span_id of the parent, or None for a root span.")
    name: str
    kind: SpanKind = "INTERNAL"
    start_time: int = Field(description="Nanoseconds since the Unix epoch.")
    end_time: int | None = Field(default=None, description="Nanoseconds since the Unix epoch; None if unfinished.")
    status: SpanStatus = Field(default_factory=SpanStatus)
    attributes: Attributes = Field(default_factory=dict)
    events: list[SpanEvent] = Field(default_factory=list[SpanEvent])
    links: list[SpanLink] = Field(default_factory=list[SpanLink])
    resource: Attributes = Field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        """Wall time of the span in seconds, or None if it has not ended."""
        if self.end_time is None:
            return None
        return (self.end_time - self.start_time) / 1e9
