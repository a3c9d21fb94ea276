"""The rig of every "through the LLM proxy" test: store, fake upstream and proxy on loopback, and the join checks.

An integration's hook spans and the proxy's spans of the same LLM calls go to one store; the tests then check that
each call has a hook twin (agent name) and a proxy twin (token ids) that the adapter joins into one call.

This module imports only core, pytest and the standard library: the CrewAI suite runs it in a virtual environment
that has nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence

from agentlightning import semconv
from agentlightning.adapter import LLMCall, find_llm_calls
from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeReply, FakeRequest, FakeToolCall
from agentlightning.tracing import LightningTracer, StoreSpanSink, init_tracing, shutdown_tracing
from agentlightning.types import Rollout
from agentlightning.types.spans import Span


def add_then_answer(request: FakeRequest) -> FakeReply:
    """A tool loop: call add(2, 3) first, answer once the tool result is in the conversation."""
    if request.has_tool_results:
        return FakeReply(text="The sum is 5.")
    return FakeReply(tool_calls=[FakeToolCall("add", '{"a":2,"b":3}', id="call_add")])


class ProxyRig:
    """Store, fake upstream and proxy on loopback; hook spans reach the same store through the tracing pipeline."""

    def __init__(
        self,
        store: InMemoryLightningStore,
        upstream_url: str,
        proxy: ProxyServer,
        tracer: LightningTracer,
        flush_hook: Callable[[], bool] | None = None,
    ) -> None:
        """Wrap running servers; ``flush_hook`` delivers spans an integration buffers itself (True when done)."""
        self.store = store
        self.upstream_url = upstream_url
        self.proxy = proxy
        self.tracer = tracer
        self._flush_hook = flush_hook

    async def aclaim(self) -> tuple[Rollout, str]:
        """Enqueue a rollout and claim it: the rollout and the id of its attempt."""
        await self.store.enqueue_rollout({"task": "add"})
        claimed = await self.store.claim_rollout("worker")
        assert claimed is not None
        return claimed.rollout, claimed.attempt.attempt_id

    def claim(self) -> tuple[Rollout, str]:
        """:meth:`aclaim` from sync code."""
        return asyncio.run(self.aclaim())

    def new_attempt(self) -> tuple[str, str]:
        """A claimed attempt's (rollout id, attempt id)."""
        rollout, attempt_id = self.claim()
        return rollout.rollout_id, attempt_id

    async def anew_attempt(self) -> tuple[str, str]:
        """:meth:`new_attempt` on the running event loop."""
        rollout, attempt_id = await self.aclaim()
        return rollout.rollout_id, attempt_id

    def _flush(self) -> None:
        if self._flush_hook is not None:
            assert self._flush_hook(), "the integration did not deliver its spans in time"
        self.tracer.flush()
        self.proxy.flush()

    def spans(self, rollout_id: str) -> list[Span]:
        """Every span of the rollout in the store, hook's and proxy's, after flushing both."""
        self._flush()
        return asyncio.run(self.store.query_spans(rollout_id))

    async def aspans(self, rollout_id: str) -> list[Span]:
        """:meth:`spans` on the running event loop (the flushes block, so they run on a worker thread)."""
        await asyncio.to_thread(self._flush)
        return await self.store.query_spans(rollout_id)


@contextlib.contextmanager
def serve_proxy_rig(
    reply: Callable[[FakeRequest], FakeReply], *, flush_hook: Callable[[], bool] | None = None
) -> Iterator[ProxyRig]:
    """A :class:`ProxyRig` whose fake upstream answers with ``reply``; tracing is shut down after the block."""
    store = InMemoryLightningStore()
    with FakeOpenAI(reply=reply).serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        try:
            yield ProxyRig(store, upstream.base_url, proxy, init_tracing(StoreSpanSink(store)), flush_hook)
        finally:
            shutdown_tracing()


def hook_and_proxy_chats(spans: Sequence[Span]) -> tuple[list[Span], list[Span]]:
    """The LLM spans of the integration's hook and the spans of the proxy, in store order."""
    hook = [
        span
        for span in spans
        if span.attributes.get(semconv.SPAN_SOURCE) == semconv.SOURCE_HOOK and span.name.startswith("chat")
    ]
    proxy = [span for span in spans if span.attributes.get(semconv.SPAN_SOURCE) == semconv.SOURCE_PROXY]
    return hook, proxy


def assert_joined(spans: Sequence[Span], calls: int, *, by_response_id: bool = True) -> list[LLMCall]:
    """Each of ``calls`` LLM calls has a hook twin and a proxy twin, joined into one call with token ids.

    With ``by_response_id`` the twins must share ``gen_ai.response.id`` (the adapter's join key); without it the
    adapter joins them by time instead. Returns the joined calls, in event order.
    """
    hook, proxy = hook_and_proxy_chats(spans)
    assert len(hook) == len(proxy) == calls
    if by_response_id:
        hook_ids = sorted(str(span.attributes.get(semconv.GEN_AI_RESPONSE_ID)) for span in hook)
        assert hook_ids == sorted(str(span.attributes.get(semconv.GEN_AI_RESPONSE_ID)) for span in proxy)
        assert all(hook_ids)
    joined = find_llm_calls(spans)
    assert len(joined) == calls
    for call in joined:
        assert sorted(call.sources) == ["hook", "proxy"]
        assert call.has_token_ids
    return joined
