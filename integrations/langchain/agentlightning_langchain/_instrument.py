"""Zero-line use: attach one shared :class:`LightningCallbackHandler` to every LangChain run inside a rollout.

LangChain asks each hook registered with ``langchain_core.tracers.context.register_configure_hook`` for a handler
(``var.get()``) every time a run's callback manager is configured, and adds what it returns (if it is not already
there). ``register_configure_hook`` has no inverse (verified in langchain-core 1.8), so the hook is registered once
per process and gated: it hands out the handler only while instrumented and inside a rollout, and ``None``
otherwise, which leaves no handler on any run.

The gate is not a ``ContextVar`` as LangChain's annotation says: a ``ContextVar`` set by ``instrument()`` would not
be seen by runner threads (each thread starts with an empty context), and only ``.get()`` is ever called on it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, cast

from langchain_core.tracers.context import register_configure_hook

from agentlightning.tracing import current_rollout
from agentlightning_langchain._handler import LightningCallbackHandler


class _RolloutGate:
    """Duck-typed stand-in for the ``ContextVar`` LangChain reads: the handler inside a rollout, else ``None``."""

    def __init__(self) -> None:
        self.handler: LightningCallbackHandler | None = None

    def get(self) -> LightningCallbackHandler | None:
        """The handler to attach to the run being configured, or ``None`` outside a rollout or when uninstrumented."""
        handler = self.handler
        if handler is None or current_rollout() is None:
            return None
        return handler


_gate = _RolloutGate()
_registered = False
_lock = threading.Lock()


def instrument(*, agent_names: Mapping[str, str] | None = None) -> None:
    """Record every LangChain/LangGraph run started inside a rollout; a second call while instrumented does nothing."""
    global _registered
    with _lock:
        if _gate.handler is not None:
            return
        _gate.handler = LightningCallbackHandler(agent_names=agent_names)
        if not _registered:
            # handle_class: LangChain skips the hook when the run already has a LightningCallbackHandler (one the
            # user passed explicitly), so a run is never recorded twice.
            register_configure_hook(
                cast(ContextVar[Any], _gate),  # duck-typed: LangChain only calls .get() (see module docstring)
                inheritable=True,
                handle_class=LightningCallbackHandler,
            )
            _registered = True


def uninstrument() -> None:
    """Stop attaching the handler to new runs (the exact inverse of :func:`instrument`)."""
    with _lock:
        _gate.handler = None
