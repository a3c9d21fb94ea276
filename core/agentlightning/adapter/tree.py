"""The span tree of one attempt: parents, children, chronological order, and the agent each span runs under."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from agentlightning import semconv
from agentlightning.conventions import apply_conventions
from agentlightning.types import Span

_AGENT_NAME = semconv.GEN_AI_AGENT_NAME
_OPERATION = semconv.GEN_AI_OPERATION_NAME
_INVOKE_AGENT = semconv.OP_INVOKE_AGENT


def span_order_key(span: Span) -> tuple[int, int, str]:
    """Chronological sort key of a span: start time, then the store's sequence id, then span id (stable ties)."""
    return (span.start_time, span.sequence_id, span.span_id)


class CallTree:
    """Spans of one attempt arranged by parent, with children in chronological order.

    A span whose ``parent_id`` names a span that is not in the set (dropped, or from another process whose spans
    never arrived) is an *orphan*: it is listed among the roots so that nothing is lost, and its agent is found by
    time (the innermost agent span whose interval encloses it) instead of by ancestry. Children, roots and orphans
    are worked out on first use: the adapter needs only parents.
    """

    __slots__ = ("_agent_names", "_agent_spans", "_children", "_orphans", "_roots", "spans")

    def __init__(self, spans: dict[str, Span]) -> None:
        """Wrap spans keyed by span id (see :func:`build_call_tree`)."""
        self.spans = spans
        self._children: dict[str, list[str]] | None = None
        self._roots: list[str] = []
        self._orphans: frozenset[str] = frozenset()
        self._agent_names: dict[str, tuple[str | None, bool]] = {}
        self._agent_spans: list[Span] | None = None

    @property
    def children(self) -> dict[str, list[str]]:
        """Child span ids of each span id, chronological (spans without children are absent)."""
        return self._arrange()

    @property
    def roots(self) -> list[str]:
        """Spans without a parent in the set (true roots and orphans), chronological."""
        self._arrange()
        return self._roots

    @property
    def orphans(self) -> frozenset[str]:
        """Spans whose parent_id names a span that is not in the set."""
        self._arrange()
        return self._orphans

    def _arrange(self) -> dict[str, list[str]]:
        if self._children is not None:
            return self._children
        spans = self.spans
        children: dict[str, list[str]] = {}
        roots: list[str] = []
        orphans: set[str] = set()
        for span in sorted(spans.values(), key=span_order_key):
            parent_id = span.parent_id
            if parent_id is None or parent_id == span.span_id:
                roots.append(span.span_id)
            elif parent_id in spans:
                children.setdefault(parent_id, []).append(span.span_id)
            else:
                roots.append(span.span_id)
                orphans.add(span.span_id)
        self._children, self._roots, self._orphans = children, roots, frozenset(orphans)
        return children

    def parent(self, span_id: str) -> Span | None:
        """The parent span, or None for a root or an orphan."""
        parent_id = self.spans[span_id].parent_id
        return None if parent_id is None else self.spans.get(parent_id)

    def ancestors(self, span_id: str) -> Iterator[Span]:
        """Ancestors from the parent up to the root (stops at a missing parent or a cycle)."""
        seen = {span_id}
        parent_id = self.spans[span_id].parent_id
        while parent_id is not None and parent_id not in seen:
            parent = self.spans.get(parent_id)
            if parent is None:
                return
            yield parent
            seen.add(parent_id)
            parent_id = parent.parent_id

    def walk(self) -> Iterator[tuple[int, Span]]:
        """Depth-first (depth, span) pairs from each root, children in chronological order."""
        stack = [(0, root) for root in reversed(self.roots)]
        seen: set[str] = set()
        while stack:
            depth, span_id = stack.pop()
            if span_id in seen:  # a malformed parent cycle must not loop forever
                continue
            seen.add(span_id)
            yield depth, self.spans[span_id]
            stack.extend((depth + 1, child) for child in reversed(self.children.get(span_id, ())))

    def agent_name(self, span_id: str) -> str | None:
        """The agent a span runs under: its own ``gen_ai.agent.name``, else the nearest ancestor's.

        When no ancestor names an agent and the ancestry is broken (a parent that never arrived) or the span is a
        root itself (a proxy span without trace context), the innermost ``invoke_agent`` span whose time interval
        encloses the span answers instead.
        """
        name, broken = self._lineage(span_id)
        if name is None and (broken or self.spans[span_id].parent_id is None):
            return self._enclosing_agent(self.spans[span_id])
        return name

    def _lineage(self, span_id: str) -> tuple[str | None, bool]:
        """(agent name from the span or its ancestors, whether the walk ended at a missing parent); memoised."""
        cache = self._agent_names
        hit = cache.get(span_id)
        if hit is not None:
            return hit
        spans = self.spans
        path: list[str] = []
        answer: tuple[str | None, bool] = (None, False)
        current: str | None = span_id
        while current is not None:
            hit = cache.get(current)
            if hit is not None:
                answer = hit
                break
            span = spans.get(current)
            if span is None:
                answer = (None, True)
                break
            path.append(current)
            own = span.attributes.get(_AGENT_NAME)
            if isinstance(own, str) and own:
                answer = (own, False)
                break
            if len(path) > len(spans):  # a parent cycle: treat like a broken chain
                answer = (None, True)
                break
            current = span.parent_id
        for visited in path:
            cache[visited] = answer
        return answer

    def _enclosing_agent(self, span: Span) -> str | None:
        agents = self._agent_spans
        if agents is None:
            agents = [
                s
                for s in self.spans.values()
                if s.attributes.get(_OPERATION) == _INVOKE_AGENT and isinstance(s.attributes.get(_AGENT_NAME), str)
            ]
            self._agent_spans = agents
        best: Span | None = None
        end = span.end_time if span.end_time is not None else span.start_time
        for agent in agents:
            if agent.span_id == span.span_id or agent.end_time is None:
                continue
            encloses = agent.start_time <= span.start_time and end <= agent.end_time
            if encloses and (best is None or agent.start_time > best.start_time):
                best = agent
        if best is None:
            return None
        name = best.attributes.get(_AGENT_NAME)
        return name if isinstance(name, str) else None


def build_call_tree(spans: Sequence[Span]) -> CallTree:
    """Arrange the spans of one attempt into a tree; input order does not matter (children sort by time).

    A span id seen twice keeps the copy with the higher sequence id (the store's latest word on it). Spans of a
    foreign convention stored unmapped (sent before ingest mapped them, or another way) are mapped here, on copies,
    and GenAI log records (OTLP ``/v1/logs``) are folded into the span they name.
    """
    spans = apply_conventions(spans)
    by_id = {span.span_id: span for span in spans}
    if len(by_id) != len(spans):
        by_id: dict[str, Span] = {}
        for span in spans:
            existing = by_id.get(span.span_id)
            if existing is None or span.sequence_id > existing.sequence_id:
                by_id[span.span_id] = span
    return CallTree(by_id)
