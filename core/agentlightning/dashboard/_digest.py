"""Per-rollout digests (reward, agents, span counts, attempts) kept up to date incrementally for the dashboard.

The table, the curves and the workers page all need facts that live in spans and attempts, which the store only
answers per rollout. A digest remembers what it has read: each refresh asks only for spans after the last sequence
id of the latest attempt, and a rollout that finished more than :data:`SETTLE_S` ago is not read again (the runner
flushes its spans before finishing an attempt, so later spans are not expected).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from agentlightning import semconv
from agentlightning.emit import final_reward
from agentlightning.store.base import LightningStore, NotFoundError
from agentlightning.types import Attempt, Rollout

SETTLE_S: Final = 30.0
MAX_DIGESTS: Final = 50_000

_AGENT = semconv.GEN_AI_AGENT_NAME
_OPERATION = semconv.GEN_AI_OPERATION_NAME
_RESPONSE_ID = semconv.GEN_AI_RESPONSE_ID
_LLM_OPERATIONS: Final = frozenset({semconv.OP_CHAT, "text_completion", "generate_content"})


@dataclass(slots=True)
class RolloutDigest:
    """What the dashboard knows about one rollout's latest attempt."""

    attempts: list[Attempt] = field(default_factory=list[Attempt])
    attempt_id: str | None = None
    last_sequence_id: int = 0
    spans: int = 0
    llm_calls: int = 0
    agents: set[str] = field(default_factory=set[str])
    response_ids: set[str] = field(default_factory=set[str])
    reward: float | None = None
    settled: bool = False

    @property
    def latest(self) -> Attempt | None:
        """The newest attempt, or None before the first claim."""
        return self.attempts[-1] if self.attempts else None


class DigestCache:
    """Digests of recently viewed rollouts, least recently used dropped past :data:`MAX_DIGESTS`."""

    def __init__(self, store: LightningStore) -> None:
        self._store = store
        self._digests: OrderedDict[str, RolloutDigest] = OrderedDict()
        self._agents: set[str] = set()
        # One refresh at a time: two concurrent reads of the same new spans would count them twice.
        self._lock = asyncio.Lock()

    @property
    def agents(self) -> list[str]:
        """Every agent name seen in any digest, sorted."""
        return sorted(self._agents)

    async def digests(self, rollouts: Sequence[Rollout]) -> list[RolloutDigest]:
        """Up-to-date digests of ``rollouts``, in the same order."""
        async with self._lock:
            return [await self._refresh(rollout) for rollout in rollouts]

    async def _refresh(self, rollout: Rollout) -> RolloutDigest:
        digest = self._digests.get(rollout.rollout_id)
        if digest is None:
            digest = RolloutDigest()
            self._digests[rollout.rollout_id] = digest
            if len(self._digests) > MAX_DIGESTS:
                self._digests.popitem(last=False)
        else:
            self._digests.move_to_end(rollout.rollout_id)
        if digest.settled or rollout.num_attempts == 0:
            return digest
        try:
            await self._read(rollout, digest)
        except NotFoundError:  # deleted between the listing and this read: show what we had
            return digest
        ended = rollout.end_time
        if rollout.is_terminal and ended is not None and time.time_ns() - ended > SETTLE_S * 1e9:
            digest.settled = True
        return digest

    async def _read(self, rollout: Rollout, digest: RolloutDigest) -> None:
        latest = digest.latest
        if latest is None or len(digest.attempts) != rollout.num_attempts or not latest.is_terminal:
            digest.attempts = await self._store.query_attempts(rollout.rollout_id)
            latest = digest.latest
        if latest is None:
            return
        if latest.attempt_id != digest.attempt_id:  # a retry: the new attempt's spans replace the old ones
            digest.attempt_id = latest.attempt_id
            digest.last_sequence_id = digest.spans = digest.llm_calls = 0
            digest.agents = set()
            digest.response_ids = set()
            digest.reward = None
        spans = await self._store.query_spans(
            rollout.rollout_id, latest.attempt_id, after_sequence_id=digest.last_sequence_id
        )
        if not spans:
            return
        digest.last_sequence_id = max(digest.last_sequence_id, max(span.sequence_id for span in spans))
        digest.spans += len(spans)
        for span in spans:
            attributes = span.attributes
            agent = attributes.get(_AGENT)
            if isinstance(agent, str) and agent:
                digest.agents.add(agent)
            if attributes.get(_OPERATION) in _LLM_OPERATIONS:
                # Proxy and hook spans of one call share a response id: count the call once.
                response_id = attributes.get(_RESPONSE_ID)
                if not isinstance(response_id, str) or not response_id:
                    digest.llm_calls += 1
                elif response_id not in digest.response_ids:
                    digest.response_ids.add(response_id)
                    digest.llm_calls += 1
        self._agents |= digest.agents
        reward = final_reward(spans)
        if reward is not None:
            digest.reward = reward
