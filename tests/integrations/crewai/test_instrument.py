"""instrument() / uninstrument(): exact inverses, idempotent, and CrewAI's telemetry off while instrumented."""

from __future__ import annotations

import os

import pytest
from crewai.events.event_bus import crewai_event_bus

import agentlightning_crewai
from agentlightning_crewai import LightningEventListener

TELEMETRY = "CREWAI_DISABLE_TELEMETRY"


def _ours_on_bus() -> int:
    """Every handler of ours on the bus, over all event classes (the bus keeps no public list)."""
    handlers = crewai_event_bus._sync_handlers  # pyright: ignore[reportPrivateUsage]  # no public list exists
    return sum(
        "LightningEventListener" in getattr(handler, "__qualname__", "")
        for registered in list(handlers.values())
        for handler in registered
    )


def test_instrument_twice_is_once() -> None:
    """A second instrument() returns the same listener and registers nothing more."""
    first = agentlightning_crewai.instrument()
    count = _ours_on_bus()
    assert count == first.handler_count > 10
    assert agentlightning_crewai.instrument() is first
    assert _ours_on_bus() == count


def test_uninstrument_offs_every_handler() -> None:
    """uninstrument() removes each handler it registered; twice is harmless; instrument() works again after it."""
    listener = agentlightning_crewai.instrument()
    agentlightning_crewai.uninstrument()
    agentlightning_crewai.uninstrument()
    assert _ours_on_bus() == 0
    assert listener.handler_count == 0
    again = agentlightning_crewai.instrument()
    assert again is not listener and _ours_on_bus() == again.handler_count


def test_listener_remove_is_its_own_undo() -> None:
    """A listener made directly registers on creation (as every BaseEventListener does) and remove() undoes it."""
    listener = LightningEventListener()
    assert _ours_on_bus() == listener.handler_count
    listener.remove()
    assert _ours_on_bus() == 0


def test_telemetry_off_while_instrumented(monkeypatch: pytest.MonkeyPatch) -> None:
    """instrument() sets CREWAI_DISABLE_TELEMETRY=true when unset and uninstrument() takes it back."""
    monkeypatch.delenv(TELEMETRY, raising=False)
    agentlightning_crewai.instrument()
    assert os.environ[TELEMETRY] == "true"
    agentlightning_crewai.uninstrument()
    assert TELEMETRY not in os.environ


def test_users_telemetry_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit value is the user's decision: neither instrument() nor uninstrument() touches it."""
    monkeypatch.setenv(TELEMETRY, "false")
    agentlightning_crewai.instrument()
    assert os.environ[TELEMETRY] == "false"
    agentlightning_crewai.uninstrument()
    assert os.environ[TELEMETRY] == "false"
    monkeypatch.delenv(TELEMETRY)
    agentlightning_crewai.instrument(disable_telemetry=False)
    assert TELEMETRY not in os.environ
