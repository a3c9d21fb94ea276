"""Integration discovery, the missing-extra message, and flushing of already-imported integrations."""

from __future__ import annotations

import sys
import types

import pytest

from agentlightning import extras


def test_installed_members_are_discovered() -> None:
    found = extras.installed_integrations()
    assert found["langchain"] == "agentlightning_langchain"
    assert found["trainer"] == "agentlightning_trainer"


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "installed_integrations", lambda: {"langchain": "agentlightning_langchain"})
    with pytest.raises(extras.MissingExtraError, match=r'pip install "agent-lightning\[crewai\]"'):
        extras.require_integration("crewai")
    with pytest.raises(ValueError, match="unknown integration 'nope'"):
        extras.require_integration("nope")
    assert extras.require_integration("langchain") == "agentlightning_langchain"


def test_flush_calls_only_imported_integrations_and_survives_failures(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[str, float]] = []
    good = types.ModuleType("fake_good")
    good.flush = lambda timeout_s: calls.append(("good", timeout_s))  # type: ignore[attr-defined]  # test module

    def broken_flush(timeout_s: float) -> None:
        raise RuntimeError("boom")

    bad = types.ModuleType("fake_bad")
    bad.flush = broken_flush  # type: ignore[attr-defined]  # test module
    monkeypatch.setitem(sys.modules, "fake_good", good)
    monkeypatch.setitem(sys.modules, "fake_bad", bad)
    monkeypatch.setattr(
        extras,
        "installed_integrations",
        lambda: {"good": "fake_good", "bad": "fake_bad", "absent": "fake_not_imported_module"},
    )
    extras.flush_loaded_integrations(1.5)
    assert calls == [("good", 1.5)]
    assert "fake_not_imported_module" not in sys.modules
    assert "flushing the bad integration failed" in caplog.text
