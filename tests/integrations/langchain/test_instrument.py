"""The zero-line hook: attached only inside a rollout, never twice, and gone after uninstrument()."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_core.callbacks import CallbackManager

import agentlightning_langchain
from agentlightning.tracing import rollout_context
from agentlightning_langchain import LightningCallbackHandler
from tests.integrations.conformance import SpanCapture
from tests.integrations.langchain.fakes import TEAM_TREE, build_team, team_input, team_models, tree


@pytest.fixture
def instrumented() -> Iterator[None]:
    """instrument() for one test, with the renaming the team graph's expected tree uses."""
    agentlightning_langchain.instrument(agent_names={"researcher": "research_agent"})
    try:
        yield
    finally:
        agentlightning_langchain.uninstrument()


def _our_handlers() -> list[LightningCallbackHandler]:
    return [h for h in CallbackManager.configure().handlers if isinstance(h, LightningCallbackHandler)]


@pytest.mark.usefixtures("instrumented")
def test_only_inside_a_rollout(capture: SpanCapture) -> None:
    """Outside a rollout no handler is attached and nothing is recorded; inside, the whole graph is."""
    assert _our_handlers() == []
    build_team(*team_models()).invoke(team_input())
    assert capture.spans() == []
    with rollout_context("ro-1", "at-1"):
        assert len(_our_handlers()) == 1
        build_team(*team_models()).invoke(team_input())
    spans = capture.spans()
    assert tree(spans) == TEAM_TREE
    assert {span.rollout_id for span in spans} == {"ro-1"}


@pytest.mark.usefixtures("instrumented")
async def test_only_inside_a_rollout_async(capture: SpanCapture) -> None:
    """The same for ainvoke: the gate is read in the task that configures the run."""
    await build_team(*team_models()).ainvoke(team_input())
    with rollout_context("ro-2", "at-2"):
        await build_team(*team_models()).ainvoke(team_input())
    assert tree(capture.spans()) == TEAM_TREE


@pytest.mark.usefixtures("instrumented")
def test_explicit_handler_and_instrument_record_once(capture: SpanCapture) -> None:
    """A run that already has a LightningCallbackHandler is not given a second one by the hook."""
    explicit = LightningCallbackHandler(agent_names={"researcher": "research_agent"})
    with rollout_context("ro-1", "at-1"):
        build_team(*team_models()).invoke(team_input(), {"callbacks": [explicit]})
    assert tree(capture.spans()) == TEAM_TREE


def test_instrument_is_idempotent_and_uninstrument_is_its_inverse(capture: SpanCapture) -> None:
    """instrument() twice keeps the first handler; uninstrument() leaves no handler and records nothing."""
    agentlightning_langchain.instrument()
    try:
        with rollout_context("ro-1", "at-1"):
            (first,) = _our_handlers()
            agentlightning_langchain.instrument(agent_names={"planner": "ignored"})
            (second,) = _our_handlers()
            assert first is second
    finally:
        agentlightning_langchain.uninstrument()
    with rollout_context("ro-1", "at-1"):
        assert _our_handlers() == []
        build_team(*team_models()).invoke(team_input())
    assert capture.spans() == []
