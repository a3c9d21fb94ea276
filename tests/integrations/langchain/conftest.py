"""Fixtures of the LangChain integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
