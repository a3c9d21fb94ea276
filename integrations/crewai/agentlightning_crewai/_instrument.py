"""Zero-line use: one shared :class:`LightningEventListener` on CrewAI's event bus, and telemetry off.

CrewAI sends its own telemetry to its servers unless ``CREWAI_DISABLE_TELEMETRY`` is true; it reads the variable on
every telemetry operation (crewai 1.15), so setting it here turns telemetry off for crews already built. A user's
explicit value is kept. ``OTEL_SDK_DISABLED`` would also silence it but disables every OpenTelemetry SDK in the
process, ours included, so it is never used.
"""

from __future__ import annotations

import os
import threading

from agentlightning_crewai._listener import LightningEventListener

_TELEMETRY_ENV = "CREWAI_DISABLE_TELEMETRY"

_lock = threading.Lock()
_listener: LightningEventListener | None = None
_set_telemetry_env = False


def instrument(*, disable_telemetry: bool = True) -> LightningEventListener:
    """Record every crew kicked off inside a rollout; a second call while instrumented returns the same listener."""
    global _listener, _set_telemetry_env
    with _lock:
        if _listener is not None:
            return _listener
        if disable_telemetry and _TELEMETRY_ENV not in os.environ:
            os.environ[_TELEMETRY_ENV] = "true"
            _set_telemetry_env = True
        _listener = LightningEventListener()
        return _listener


def uninstrument() -> None:
    """Remove every handler :func:`instrument` registered and restore the telemetry setting (its exact inverse)."""
    global _listener, _set_telemetry_env
    with _lock:
        listener, _listener = _listener, None
        if listener is not None:
            listener.remove()
        if _set_telemetry_env:
            os.environ.pop(_TELEMETRY_ENV, None)
            _set_telemetry_env = False


def flush(timeout_s: float = 30.0) -> bool:
    """Wait until CrewAI has handed every event to the listener and finished crews' spans are closed."""
    listener = _listener
    if listener is None:
        return True
    return listener.flush(timeout_s)
