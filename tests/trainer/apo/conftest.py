"""Fixtures of the APO tests: the agent's model and the scripted optimiser, each a fake OpenAI upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentlightning.testing.fake_openai import FakeOpenAI, FakeOpenAIServer
from tests.trainer.apo._word_task import agent_model, scripted_optimizer


@pytest.fixture
def agent_upstream() -> Iterator[FakeOpenAIServer]:
    """The model the agent calls."""
    with FakeOpenAI(reply=agent_model).serve() as server:
        yield server


@pytest.fixture
def optimizer_upstream() -> Iterator[FakeOpenAIServer]:
    """The scripted optimiser LLM."""
    with FakeOpenAI(reply=scripted_optimizer).serve() as server:
        yield server
