"""Fixtures of the AutoGen integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agentlightning_autogen


@pytest.fixture
def instrumented() -> Iterator[None]:
    """AutoGen instrumented for the test, uninstrumented after it."""
    agentlightning_autogen.instrument()
    try:
        yield
    finally:
        agentlightning_autogen.uninstrument()
