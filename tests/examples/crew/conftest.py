"""Fixtures of the crew example's tests (run in .venv-crewai, like tests/integrations/crewai)."""

from __future__ import annotations

import os

# Before crewai is imported anywhere: the suite is offline and sends no telemetry.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

import warnings

import pytest

with warnings.catch_warnings():
    # crewai 1.15.30's lazy ``crewai.rag`` package trips CPython's ImportWarning on first import (see
    # tests/integrations/crewai/conftest.py); import it once under the filter.
    warnings.filterwarnings("ignore", "Cannot set an attribute on 'crewai", ImportWarning)
    import crewai  # noqa: F401  # pyright: ignore[reportUnusedImport]  # for the one-time import under the filter

# crewai 1.15.30 reads its own deprecated fields in its own code on every kickoff; nothing the example can change.
_CREWAI_WARNINGS = ("ignore::DeprecationWarning:crewai",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Apply the filters above to this directory's tests only, and mark them as the crewai environment's."""
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.crewai)
            for spec in _CREWAI_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))
