"""Fixtures every integration's tests share (core, pytest and the standard library only: see conformance.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integrations.conformance import SpanCapture, captured_spans


@pytest.fixture
def capture() -> Iterator[SpanCapture]:
    """The process-wide tracing pipeline of one test, delivering to a list."""
    with captured_spans() as capture:
        yield capture
