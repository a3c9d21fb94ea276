"""emit helpers write exactly the documented attributes; bad input and calls outside a rollout fail clearly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from agentlightning import semconv
from agentlightning.emit import (
    EMIT_OUTSIDE_ROLLOUT_ENV,
    OPERATION_INPUT,
    OPERATION_OUTPUT,
    OutsideRolloutError,
    OutsideRolloutWarning,
    emit_annotation,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    final_reward,
    find_rewards,
    operation,
)
from agentlightning.tracing import ListSpanSink, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types import Span

IDS = {semconv.ROLLOUT_ID: "ro-1", semconv.ATTEMPT_ID: "at-1"}
EMIT = {semconv.SPAN_SOURCE: semconv.SOURCE_EMIT}


@pytest.fixture
def sink() -> Iterator[ListSpanSink]:
    sink = ListSpanSink()
    init_tracing(sink)
    yield sink
    shutdown_tracing()


def _spans(sink: ListSpanSink) -> list[Span]:
    shutdown_tracing()
    return sink.spans


# --- rewards --------------------------------------------------------------------------------------------------------
def test_scalar_reward_attributes(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        assert emit_reward(0.75) is not None
        emit_reward(1, primary="accuracy")
    first, second = _spans(sink)
    assert first.name == semconv.SPAN_REWARD
    assert first.attributes == {
        **EMIT,
        **IDS,
        "agentlightning.reward.value": 0.75,
        semconv.REWARD_PRIMARY: "value",
    }
    assert second.attributes["agentlightning.reward.accuracy"] == 1.0
    assert isinstance(second.attributes["agentlightning.reward.accuracy"], float)
    assert second.attributes[semconv.REWARD_PRIMARY] == "accuracy"


def test_dimensional_reward_attributes(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        emit_reward({"accuracy": 1.0, "brevity": 0.2}, primary="accuracy", attributes={"judge": "exact"})
        emit_reward({"only": 0.5})
    multi, single = _spans(sink)
    assert multi.attributes == {
        **EMIT,
        **IDS,
        "judge": "exact",
        "agentlightning.reward.accuracy": 1.0,
        "agentlightning.reward.brevity": 0.2,
        semconv.REWARD_PRIMARY: "accuracy",
    }
    assert single.attributes[semconv.REWARD_PRIMARY] == "only"


@pytest.mark.parametrize(
    ("value", "primary", "match"),
    [
        (float("nan"), None, r"^value: .*finite, got nan"),
        (float("inf"), None, r"^value: .*finite, got inf"),
        ("0.5", None, r"^value: .*finite number, got str"),
        (None, None, r"^value: .*got NoneType"),
        (True, None, r"^value: .*got bool"),
        ({}, None, r"^value: reward dict is empty"),
        ({"a": 1.0, "b": 0.0}, None, r"^primary: the reward has 2 dimensions \('a', 'b'\); pass primary="),
        ({"a": 1.0}, "b", r"^primary: 'b' is not a dimension of the reward; dimensions are 'a'"),
        ({"primary": 1.0}, None, r"^value: 'primary' cannot be a reward dimension name"),
        ({"a": float("-inf")}, None, r"^value\['a'\]: a reward must be finite"),
        ({"a": "high"}, None, r"^value\['a'\]: .*got str"),
        ({1: 0.5}, None, r"^value: reward dimension names must be non-empty strings"),
        (0.5, "primary", r"^primary: 'primary' cannot be"),
    ],
)
def test_malformed_rewards_name_the_field(sink: ListSpanSink, value: Any, primary: str | None, match: str) -> None:
    with rollout_context("ro-1", "at-1"), pytest.raises(ValueError, match=match):
        emit_reward(value, primary=primary)
    assert _spans(sink) == []


def test_reward_attributes_cannot_shadow_dimensions(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"), pytest.raises(ValueError, match=r"^attributes: key .* is reserved"):
        emit_reward(1.0, attributes={"agentlightning.reward.extra": 1.0})


def test_bad_input_is_rejected_outside_a_rollout_too() -> None:
    with pytest.raises(ValueError, match="finite"):
        emit_reward(float("nan"))


# --- outside a rollout --------------------------------------------------------------------------------------------
def test_outside_rollout_raises_by_default(sink: ListSpanSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMIT_OUTSIDE_ROLLOUT_ENV, raising=False)
    with pytest.raises(OutsideRolloutError, match=r"emit_reward was called outside a rollout.*rollout_context"):
        emit_reward(1.0)
    with pytest.raises(OutsideRolloutError, match="emit_message"):
        emit_message("hi")


def test_outside_rollout_warn_and_ignore(sink: ListSpanSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMIT_OUTSIDE_ROLLOUT_ENV, "warn")
    with pytest.warns(OutsideRolloutWarning, match="emit_reward was called outside a rollout"):
        assert emit_reward(1.0) is None
    monkeypatch.setenv(EMIT_OUTSIDE_ROLLOUT_ENV, "ignore")
    assert emit_annotation(k=1) is None
    assert emit_object([1]) is None
    assert _spans(sink) == []


def test_outside_rollout_flag_must_be_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMIT_OUTSIDE_ROLLOUT_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"AGENTLIGHTNING_EMIT_OUTSIDE_ROLLOUT='sometimes' is not one of error"):
        emit_reward(1.0)


def test_reward_inside_rollout_without_tracer_is_never_silently_lost() -> None:
    with rollout_context("ro-9", "at-9"), pytest.raises(RuntimeError, match=r"rollout ro-9.*init_tracing"):
        emit_reward(1.0)


# --- other helpers --------------------------------------------------------------------------------------------------
class Answer(BaseModel):
    text: str
    score: float


@dataclass
class Point:
    x: int
    y: int


def test_helpers_reject_bad_input(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        with pytest.raises(ValueError, match=r"^text: emit_message takes a str"):
            emit_message(42)  # type: ignore[arg-type]  # checking the runtime guard for untyped callers
        with pytest.raises(ValueError, match=r"^obj: object is not JSON-serialisable"):
            emit_object(object())
        with pytest.raises(ValueError, match=r"^annotations: emit_annotation needs at least one"):
            emit_annotation()
    assert _spans(sink) == []


def test_recorded_helper_spans(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        emit_message("hello")
        emit_object({"answer": Answer(text="4", score=1.0), "points": [Point(1, 2)]})
        emit_annotation(step=3, tags=["a", "b"], config={"k": [1, "x"]}, flag=True)
    message, obj, annotation = _spans(sink)
    assert (message.name, message.attributes) == (semconv.SPAN_MESSAGE, {**EMIT, **IDS, semconv.MESSAGE_BODY: "hello"})
    assert obj.name == semconv.SPAN_OBJECT
    assert json.loads(str(obj.attributes[semconv.OBJECT_JSON])) == {
        "answer": {"text": "4", "score": 1.0},
        "points": [{"x": 1, "y": 2}],
    }
    assert annotation.name == semconv.SPAN_ANNOTATION
    assert annotation.attributes == {
        **EMIT,
        **IDS,
        "agentlightning.annotation.step": 3,
        "agentlightning.annotation.tags": ["a", "b"],
        "agentlightning.annotation.config": '{"k":[1,"x"]}',
        "agentlightning.annotation.flag": True,
    }


def test_exception_span(sink: ListSpanSink) -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        with rollout_context("ro-1", "at-1"):
            emit_exception(exc)
    with rollout_context("ro-1", "at-1"), pytest.raises(ValueError, match=r"^exc: emit_exception takes an exception"):
        emit_exception("not an exception")  # type: ignore[arg-type]  # checking the runtime guard
    (span,) = _spans(sink)
    assert span.name == semconv.SPAN_EXCEPTION
    assert span.status.code == "ERROR" and span.status.message == "KeyError: 'missing'"
    assert span.attributes[semconv.ERROR_TYPE] == "KeyError"
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "KeyError"
    assert "raise KeyError" in str(event.attributes["exception.stacktrace"])


# --- operation ------------------------------------------------------------------------------------------------------
class Calculator:
    @operation
    def add(self, a: int, b: int = 1) -> int:
        return a + b


@operation("multiply")
async def multiply(a: float, b: float) -> float:
    await asyncio.sleep(0)
    return a * b


@operation(record_io=False)
def secret(token: str) -> str:
    return token[::-1]


@operation
def fails(reason: str) -> None:
    raise RuntimeError(reason)


async def test_operation_decorator_sync_and_async(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        assert Calculator().add(2, b=3) == 5
        assert await multiply(2, 4) == 8
        assert secret("abc") == "cba"
        with pytest.raises(RuntimeError, match=r"^no luck$"):
            fails("no luck")
    add, mult, sec, failed = _spans(sink)
    assert add.name == semconv.SPAN_OPERATION_PREFIX + "Calculator.add"
    assert json.loads(str(add.attributes[OPERATION_INPUT])) == {"a": 2, "b": 3}  # self is left out
    assert add.attributes[OPERATION_OUTPUT] == "5"
    assert (add.rollout_id, add.attempt_id) == ("ro-1", "at-1")
    assert mult.name == "agentlightning.operation.multiply"
    assert json.loads(str(mult.attributes[OPERATION_INPUT])) == {"a": 2, "b": 4}
    assert mult.attributes[OPERATION_OUTPUT] == "8"
    assert OPERATION_INPUT not in sec.attributes and OPERATION_OUTPUT not in sec.attributes
    assert failed.status.code == "ERROR" and failed.attributes[semconv.ERROR_TYPE] == "RuntimeError"
    assert [e.name for e in failed.events] == ["exception"]


async def test_operation_context_manager_parents_inner_spans(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        with operation("plan") as op:
            op.set_input(goal="win")
            emit_reward(1.0)
            op.set_output({"steps": 2})
            assert op.span is not None
        async with operation("act"):
            await asyncio.sleep(0)
        with pytest.raises(ValueError, match="inside"), operation("broken"):
            raise ValueError("inside")
    reward, plan, act, broken = _spans(sink)
    assert plan.name == "agentlightning.operation.plan" and reward.parent_id == plan.span_id
    assert json.loads(str(plan.attributes[OPERATION_INPUT])) == {"goal": "win"}
    assert json.loads(str(plan.attributes[OPERATION_OUTPUT])) == {"steps": 2}
    assert act.name == "agentlightning.operation.act" and act.parent_id is None
    assert broken.status.code == "ERROR" and broken.attributes[semconv.ERROR_TYPE] == "ValueError"


def test_operation_records_unserialisable_values_without_breaking(sink: ListSpanSink) -> None:
    @operation
    def identity(value: object) -> object:
        return value

    marker = object()
    with rollout_context("ro-1", "at-1"):
        assert identity(marker) is marker
    (span,) = _spans(sink)
    assert "object object at" in str(span.attributes[OPERATION_OUTPUT])


def test_operation_works_outside_rollouts_and_rejects_generators() -> None:
    @operation
    def plain() -> int:
        return 1

    assert plain() == 1  # no tracer, no rollout: the user's function still runs
    with pytest.raises(ValueError, match="cannot wrap generator function"):

        @operation
        def gen() -> Iterator[int]:
            yield 1


# --- readers ------------------------------------------------------------------------------------------------------
def _reward_span(span_id: str, attributes: dict[str, Any], *, sequence_id: int = 0, end: int = 10) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=sequence_id,
        trace_id="1" * 32,
        span_id=span_id,
        name=semconv.SPAN_REWARD,
        start_time=1,
        end_time=end,
        attributes=attributes,
    )


def test_find_rewards_reads_back_emitted_rewards(sink: ListSpanSink) -> None:
    with rollout_context("ro-1", "at-1"):
        emit_message("not a reward")
        emit_reward(0.5)
        emit_reward({"accuracy": 1.0, "cost": -0.25}, primary="accuracy")
    spans = _spans(sink)
    rewards = find_rewards(spans)
    assert [(r.dimensions, r.primary, r.value) for r in rewards] == [
        ({"value": 0.5}, "value", 0.5),
        ({"accuracy": 1.0, "cost": -0.25}, "accuracy", 1.0),
    ]
    assert rewards[1].span.span_id == spans[2].span_id
    assert final_reward(spans) == 1.0


def test_final_reward_orders_by_sequence_id_then_time() -> None:
    a = _reward_span("a" * 16, {"agentlightning.reward.value": 0.1}, sequence_id=3, end=50)
    b = _reward_span("b" * 16, {"agentlightning.reward.value": 0.9}, sequence_id=2, end=99)
    assert final_reward([a, b]) == 0.1  # sequence id wins over clocks
    c = _reward_span("c" * 16, {"agentlightning.reward.value": 0.3}, end=20)
    d = _reward_span("d" * 16, {"agentlightning.reward.value": 0.7}, end=10)
    assert final_reward([c, d]) == 0.3  # unstored spans: by end time
    no_primary = _reward_span("e" * 16, {"agentlightning.reward.x": 1.0, "agentlightning.reward.y": 2.0}, end=30)
    (read,) = find_rewards([no_primary])
    assert (read.primary, read.value, read.dimensions) == (None, None, {"x": 1.0, "y": 2.0})
    assert final_reward([c, no_primary]) == 0.3  # the last reward that has a primary value
    assert final_reward([]) is None
