"""@rollout / LitAgent: what a rollout function receives and what it may return."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from agentlightning.agent import (
    AgentSignatureError,
    FunctionAgent,
    InvalidRewardError,
    LitAgent,
    Reward,
    as_agent,
    load_agent,
    normalize_reward,
    rollout,
)
from agentlightning.types import LLM, Attempt, PromptTemplate, ResourcesSnapshot, Rollout

ROLLOUT = Rollout(rollout_id="ro-1", input={"q": "2+2"}, enqueue_time=1)
ATTEMPT = Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=1)
PROXIED = LLM(base_url="http://127.0.0.1:4748", model="policy", proxied=True)
DIRECT = LLM(base_url="http://127.0.0.1:8000/v1", model="judge")
TEMPLATE = PromptTemplate(template="Q: {q}")


def snapshot(**resources: Any) -> ResourcesSnapshot:
    return ResourcesSnapshot(resources_id="rs-1", version=1, create_time=1, resources=resources)


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (None, None),
        (1, Reward({"value": 1.0}, "value")),
        (0.25, Reward({"value": 0.25}, "value")),
        ({"accuracy": 1.0, "brevity": 0.5}, Reward({"accuracy": 1.0, "brevity": 0.5}, "accuracy")),
        ({"accuracy": 1.0, "brevity": 0.5, "primary": "brevity"}, Reward({"accuracy": 1.0, "brevity": 0.5}, "brevity")),
    ],
)
def test_rewards_normalise(returned: Any, expected: Reward | None) -> None:
    assert normalize_reward(returned) == expected


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("42", "returned '42' (str)"),
        (True, "returned True (bool)"),
        (math.nan, "is nan"),
        (math.inf, "is inf"),
        ({}, "at least one dimension"),
        ({"primary": "a"}, "at least one dimension"),
        ({"a": "high"}, "'a' is 'high' (str)"),
        ({"a": 1.0, "primary": "b"}, "primary 'b'"),
        ([1.0], "returned [1.0] (list)"),
    ],
)
def test_garbage_rewards_are_explained(returned: Any, message: str) -> None:
    with pytest.raises(InvalidRewardError, match=re.escape(message)):
        normalize_reward(returned)


def test_parameters_are_injected_by_name() -> None:
    @rollout
    def agent(task: Any, llm: LLM, prompt_template: PromptTemplate, judge: LLM, rollout: Rollout, attempt: Attempt):
        return task, llm, prompt_template, judge, rollout, attempt

    args, kwargs = agent.bind(ROLLOUT, ATTEMPT, snapshot(llm=PROXIED, prompt_template=TEMPLATE, judge=DIRECT))
    task, llm, template, judge, got_rollout, got_attempt = agent.rollout(*args, **kwargs)
    assert task == {"q": "2+2"} and template is TEMPLATE and judge is DIRECT
    assert (got_rollout, got_attempt) == (ROLLOUT, ATTEMPT)
    assert llm.base_url == "http://127.0.0.1:4748/rollout/ro-1/attempt/at-1/v1"
    assert llm.base_url_for("ro-1", "at-1") == llm.base_url  # already routed: routing again changes nothing


def test_the_only_llm_and_template_fill_generic_names() -> None:
    def agent(task: Any, /, llm: LLM, prompt_template: PromptTemplate, resources: ResourcesSnapshot) -> None:
        return None

    resources = snapshot(policy=DIRECT, main=TEMPLATE)
    args, kwargs = as_agent(agent).bind(ROLLOUT, ATTEMPT, resources)
    assert args == [ROLLOUT.input] and kwargs == {"llm": DIRECT, "prompt_template": TEMPLATE, "resources": resources}


def test_defaults_stay_when_nothing_matches() -> None:
    def agent(task: Any, temperature: float = 0.7, llm: LLM | None = None) -> None:
        return None

    assert as_agent(agent).bind(ROLLOUT, ATTEMPT, None) == ([ROLLOUT.input], {})


def test_missing_resources_say_what_exists() -> None:
    def agent(task: Any, critic: LLM) -> None:
        return None

    with pytest.raises(AgentSignatureError, match=re.escape("resources are ['judge', 'llm']")):
        as_agent(agent).bind(ROLLOUT, ATTEMPT, snapshot(llm=PROXIED, judge=DIRECT))
    with pytest.raises(AgentSignatureError, match="add_resources"):
        as_agent(agent).bind(ROLLOUT, ATTEMPT, None)


def test_a_function_needs_a_task_parameter() -> None:
    with pytest.raises(AgentSignatureError, match="first positional parameter"):
        rollout(lambda: 1.0)
    with pytest.raises(AgentSignatureError, match="first positional parameter"):

        @rollout
        def keyword_only(*, task: Any) -> float:
            return 1.0


class Solver(LitAgent):
    async def rollout(self, task: Any, /, prompt_template: PromptTemplate) -> float:  # pyright: ignore[reportIncompatibleMethodOverride]
        return float(len(prompt_template.format(**task)))


def test_lit_agent_subclass_and_decorator_forms() -> None:
    agent = as_agent(Solver)
    assert agent.name == "Solver" and agent.is_async
    assert agent.bind(ROLLOUT, ATTEMPT, snapshot(prompt_template=TEMPLATE)) == (
        [ROLLOUT.input],
        {"prompt_template": TEMPLATE},
    )

    @rollout(name="adder")
    def add(task: dict[str, int]) -> float:
        return float(task["a"] + task["b"])

    assert isinstance(add, FunctionAgent) and add.name == "adder" and not add.is_async
    assert add({"a": 1, "b": 2}) == 3.0  # still callable as the user's function


def test_load_agent_errors_teach() -> None:
    assert load_agent("tests.core.runner.agents:counting").name == "counting"
    with pytest.raises(ValueError, match=re.escape("package.module:function")):
        load_agent("tests.core.runner.agents")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        load_agent("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"has no attribute 'nope'.*counting"):
        load_agent("tests.core.runner.agents:nope")
    with pytest.raises(TypeError, match="is not an agent"):
        load_agent("tests.core.runner.agents:COUNTING_SPANS")
