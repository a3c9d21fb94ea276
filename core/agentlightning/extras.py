"""Discovery of installed integrations and clear errors for missing extras."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Final

from agentlightning.semconv import INTEGRATIONS_ENTRY_POINT_GROUP

# integration name (entry-point name) -> the extra of the `agent-lightning` meta package that installs it
EXTRAS: Final[dict[str, str]] = {
    "langchain": "langchain",
    "autogen": "autogen",
    "openai_agents": "openai-agents",
    "crewai": "crewai",
    "trainer": "trainer",
}


class MissingExtraError(ImportError):
    """An optional member of Agent Lightning is not installed."""


def installed_integrations() -> dict[str, str]:
    """Installed members announcing themselves in the entry-point group: name -> import module."""
    return {ep.name: ep.value for ep in entry_points(group=INTEGRATIONS_ENTRY_POINT_GROUP)}


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
