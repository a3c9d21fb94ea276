"""Discovery of installed integrations and clear errors for missing extras."""

from __future__ import annotations

import logging
import sys
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Final

from agentlightning.semconv import INTEGRATIONS_ENTRY_POINT_GROUP

# integration name (entry-point name) -> the extra of the `agent-lightning` meta package that installs it
EXTRAS: Final[dict[str, str]] = {
    "langchain": "langchain",
    "autogen": "autogen",
    "openai_agents": "openai-agents",
    "crewai": "crewai",
    "trainer": "trainer",
}


logger = logging.getLogger(__name__)


class MissingExtraError(ImportError):
    """An optional member of Agent Lightning is not installed."""


@cache
def installed_integrations() -> dict[str, str]:
    """Installed members announcing themselves in the entry-point group: name -> import module."""
    return {ep.name: ep.value for ep in entry_points(group=INTEGRATIONS_ENTRY_POINT_GROUP)}


def flush_loaded_integrations(timeout_s: float) -> None:
    """Call ``flush(timeout_s)`` of every installed integration the process has already imported.

    Some frameworks deliver their events later on threads of their own (CrewAI's event bus), so a rollout's last
    spans exist only after the integration flushes. Integrations not imported yet are skipped: flushing must never
    import a framework. A failing flush is logged, never raised into the runner.
    """
    for name, module_name in installed_integrations().items():
        module: Any = sys.modules.get(module_name)
        flush = getattr(module, "flush", None) if module is not None else None
        if not callable(flush):
            continue
        try:
            flush(timeout_s)
        except Exception:
            logger.warning(
                "flushing the %s integration failed; some spans may reach the store late", name, exc_info=True
            )


def require_integration(name: str) -> str:
    """The import module of integration ``name``; raises MissingExtraError saying which extra to install."""
    found = installed_integrations()
    if name in found:
        return found[name]
    if name not in EXTRAS:
        raise ValueError(f"unknown integration {name!r}; known: {sorted(EXTRAS)}")
    raise MissingExtraError(
        f'the {name} integration is not installed; run: pip install "agent-lightning[{EXTRAS[name]}]" '
        f"(installed: {sorted(found) or 'none'})"
    )


# The HTTP side of core (store server, LLM proxy, dashboard, fake OpenAI upstream) lives behind the `server` extra so
# a runner machine that only traces and talks to a store installs none of it.
SERVER_MODULES: Final = ("fastapi", "uvicorn", "prometheus_client", "google.protobuf")


def require_server_extra(feature: str) -> None:
    """Raise MissingExtraError naming the install command when the ``server`` extra's packages are absent."""
    missing = [name for name in SERVER_MODULES if not _importable(name)]
    if missing:
        raise MissingExtraError(
            f"{feature} needs the server extra (missing: {', '.join(missing)}); run: "
            'pip install "agentlightning-core[server]" (the agent-lightning package includes it)'
        )


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package ("google") raises instead of returning None
        return False
