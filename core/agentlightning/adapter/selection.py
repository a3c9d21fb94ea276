"""Which agents' LLM calls are trained: exact names, glob or regex patterns, or all."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import TypeAlias

AgentSpec: TypeAlias = "str | re.Pattern[str] | Sequence[str | re.Pattern[str]] | AgentSelector | None"
"""What ``TraceAdapter(agents=...)`` and ``check_store(agents=...)`` accept; see :class:`AgentSelector`."""

_GLOB_CHARS = frozenset("*?[")
_REGEX_PREFIX = "re:"


class AgentSelector:
    """Decides whether an agent's calls are trained; the other agents' calls stay in the trace as context.

    Each item of ``agents`` is one of:

    - an exact name: ``"writer"``;
    - a glob (any of ``*``, ``?``, ``[`` in the string, matched case-sensitively over the whole name):
      ``"writer*"``;
    - a regex, matched with ``fullmatch``: a compiled ``re.compile("writer|rewriter")``, or a string prefixed with
      ``"re:"`` (handy on the command line): ``"re:(re)?writer"``.

    ``None`` selects every call, including calls whose agent is unknown; otherwise a call without an agent name is
    never selected.
    """

    __slots__ = ("_cache", "_exact", "_patterns", "_specs")

    def __init__(self, agents: str | re.Pattern[str] | Iterable[str | re.Pattern[str]] | None = None) -> None:
        """Build a selector from a name, a pattern, a list of them, or None (every agent)."""
        if agents is None:
            specs: list[str | re.Pattern[str]] | None = None
        elif isinstance(agents, str | re.Pattern):
            specs = [agents]
        else:
            specs = list(agents)
            if not specs:
                raise ValueError("agents=[] selects nothing; pass None to train every agent, or name at least one")
        self._specs = specs
        self._exact: set[str] = set()
        self._patterns: list[re.Pattern[str]] = []
        self._cache: dict[str | None, bool] = {}
        for spec in specs or ():
            if isinstance(spec, re.Pattern):
                self._patterns.append(spec)
            elif spec.startswith(_REGEX_PREFIX):
                try:
                    self._patterns.append(re.compile(spec[len(_REGEX_PREFIX) :]))
                except re.error as exc:
                    raise ValueError(f"agent pattern {spec!r} is not a valid regular expression: {exc}") from exc
            elif _GLOB_CHARS.intersection(spec):
                self._patterns.append(re.compile(fnmatch.translate(spec)))
            elif spec:
                self._exact.add(spec)
            else:
                raise ValueError("an agent name must not be empty")

    @classmethod
    def of(cls, agents: AgentSpec) -> AgentSelector:
        """The selector for any accepted ``agents`` value (an AgentSelector passes through)."""
        if isinstance(agents, AgentSelector):
            return agents
        return cls(agents)

    @property
    def selects_all(self) -> bool:
        """True when every call is selected (``agents=None``)."""
        return self._specs is None

    def matches(self, agent_name: str | None) -> bool:
        """True when calls made by ``agent_name`` are trained."""
        cache = self._cache
        hit = cache.get(agent_name)
        if hit is not None:
            return hit
        if self._specs is None:
            result = True
        elif agent_name is None:
            result = False
        else:
            result = agent_name in self._exact or any(p.fullmatch(agent_name) for p in self._patterns)
        cache[agent_name] = result
        return result

    def describe(self) -> str:
        """How the selection reads in a message, e.g. ``agent 'writer'`` or ``agents 'writer', re:'crit.*'``."""
        if self._specs is None:
            return "all agents"
        parts = [repr(s) if isinstance(s, str) else f"re:{s.pattern!r}" for s in self._specs]
        return ("agent " if len(parts) == 1 else "agents ") + ", ".join(parts)

    def __repr__(self) -> str:
        return f"AgentSelector({self._specs!r})"
