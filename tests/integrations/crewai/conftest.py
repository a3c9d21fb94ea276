"""Fixtures of the CrewAI integration tests (run in .venv-crewai: ``.venv-crewai/bin/python -m pytest ...``)."""

from __future__ import annotations

import os

# Before crewai is imported anywhere: no test may send telemetry to CrewAI's servers (the suite is offline).
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

import warnings
from collections.abc import Iterator

import pytest

with warnings.catch_warnings():
    # crewai 1.15.30's lazy ``crewai.rag`` package trips CPython's ImportWarning "Cannot set an attribute on
    # 'crewai.rag' for child module 'embeddings'" on first import; nothing we can fix, so import it once here.
    warnings.filterwarnings("ignore", "Cannot set an attribute on 'crewai", ImportWarning)
    import crewai  # noqa: F401  # pyright: ignore[reportUnusedImport]  # for the one-time import under the filter


@pytest.fixture(autouse=True)
def uninstrumented() -> Iterator[None]:
    """Every test starts and ends with no listener of ours on CrewAI's (process-wide) event bus."""
    import agentlightning_crewai

    agentlightning_crewai.uninstrument()
    try:
        yield
    finally:
        agentlightning_crewai.uninstrument()


# Third-party warnings this suite cannot fix (warnings are errors in this repository), each scoped to its origin:
_CREWAI_WARNINGS = (
    # crewai 1.15.30 reads its own deprecated Agent/Crew fields (function_calling_llm, allow_code_execution, ...)
    # in its own code on every kickoff.
    "ignore::DeprecationWarning:crewai",
    # crewai warns (through pydantic's validator) that a closure as Task.callback blocks its checkpointing; the
    # tests need per-test callbacks and never checkpoint.
    "ignore:function callbacks cannot be serialized:UserWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Apply the filters above to this directory's tests only."""
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.path).startswith(here):
            for spec in _CREWAI_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))
