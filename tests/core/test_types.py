"""Every model of the data model round-trips through JSON; bad input is rejected with the field named."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from agentlightning.types import (
    LLM,
    Attempt,
    PromptTemplate,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    Span,
    SpanEvent,
    SpanLink,
    SpanStatus,
    Transition,
)

T0 = 1_700_000_000_123_456_789


def _models() -> list[BaseModel]:
    span = Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=3,
        trace_id="0" * 31 + "1",
        span_id="0" * 15 + "2",
        parent_id="0" * 15 + "1",
        name="chat gpt",
        kind="CLIENT",
        start_time=T0,
        end_time=T0 + 1,
        status=SpanStatus(code="ERROR", message="boom"),
        attributes={"a": 1, "b": [1, 2], "c": "x", "d": 0.5, "e": True, "f": ["x", "y"]},
        events=[SpanEvent(name="exception", timestamp=T0, attributes={"k": "v"})],
        links=[SpanLink(trace_id="1" * 32, span_id="2" * 16)],
        resource={"service.name": "svc"},
    )
    return [
        span,
        Rollout(rollout_id="ro-1", input={"q": 1}, enqueue_time=T0, config=RolloutConfig(max_attempts=3)),
        Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=T0),
        ResourcesSnapshot(
            resources_id="rs-1",
            version=1,
            create_time=T0,
            resources={
                "llm": LLM(base_url="http://127.0.0.1:1/v1", model="m", weights_version=2),
                "prompt": PromptTemplate(template="Q: {question}"),
                "j": PromptTemplate(template="Q: {{ question }}", engine="jinja2"),
            },
        ),
        Transition(
            rollout_id="ro-1",
            attempt_id="at-1",
            group_id="g",
            turn_index=0,
            span_id="s",
            prompt_token_ids=[1, 2],
            response_token_ids=[3],
            response_logprobs=[-0.5],
            reward=1.0,
        ),
    ]


@pytest.mark.parametrize("model", _models(), ids=lambda m: type(m).__name__)
def test_round_trips_json(model: BaseModel) -> None:
    again = type(model).model_validate_json(model.model_dump_json())
    assert again == model
    assert again.model_dump() == model.model_dump()


def test_times_are_integer_nanoseconds() -> None:
    span = _models()[0]
    assert isinstance(span, Span)
    assert span.start_time == T0
    assert span.duration_s == pytest.approx(1e-9)


def test_prompt_template_engines() -> None:
    assert PromptTemplate(template="Hi {name}!").format(name="Ada") == "Hi Ada!"
    assert PromptTemplate(template="Hi {{ name }}!", engine="jinja2").format(name="Ada") == "Hi Ada!"
    with pytest.raises(ValueError, match="name"):
        PromptTemplate(template="Hi {name}!").format()
    with pytest.raises(ValidationError, match="jinja2"):
        PromptTemplate(template="Hi {{ name", engine="jinja2")


def test_llm_base_url_for_rollout() -> None:
    llm = LLM(base_url="http://127.0.0.1:9/v1", model="m", proxied=True)
    assert llm.base_url_for("ro-1", "at-2") == "http://127.0.0.1:9/rollout/ro-1/attempt/at-2/v1"
    direct = LLM(base_url="http://127.0.0.1:9/v1", model="m")
    assert direct.base_url_for("ro-1", "at-2") == "http://127.0.0.1:9/v1"


def test_resources_lookup_errors_name_the_choices() -> None:
    snap = _models()[3]
    assert isinstance(snap, ResourcesSnapshot)
    assert snap.get_llm().model == "m"
    with pytest.raises(ValueError, match=r"\['j', 'prompt'\]"):
        snap.get_prompt_template()
    with pytest.raises(ValueError, match="no LLM named 'other'"):
        snap.get_llm("other")


def test_rollout_config_rejects_bad_retry_status() -> None:
    with pytest.raises(ValidationError, match="retry_on"):
        RolloutConfig(retry_on=("succeeded",))
    with pytest.raises(ValidationError, match="max_attempts"):
        RolloutConfig(max_attempts=0)
