"""Fixtures of the AutoGen integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agentlightning_autogen
from agentlightning.tracing import ListSpanSink, shutdown_tracing
from tests.integrations.conformance import SpanCapture


@pytest.fixture
def capture() -> Iterator[SpanCapture]:
    """The process-wide tracing pipeline of one test, delivering to a list."""
    capture = SpanCapture(ListSpanSink())
    try:
        yield capture
    finally:
        shutdown_tracing()


@pytest.fixture
def instrumented() -> Iterator[None]:
    """AutoGen instrumented for the test, uninstrumented after it."""
    agentlightning_autogen.instrument()
    try:
        yield
    finally:
        agentlightning_autogen.uninstrument()
