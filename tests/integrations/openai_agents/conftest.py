"""Fixtures of the OpenAI Agents SDK integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import set_trace_processors

from agentlightning_openai_agents import _instrument


@pytest.fixture(autouse=True)
def no_default_exporter() -> Iterator[None]:
    """No test run may queue traces for OpenAI's servers: start every test with no processors, restore after."""
    before = _instrument.registered_processors()
    set_trace_processors([])
    try:
        yield
    finally:
        _instrument.uninstrument()
        set_trace_processors(before or [])
