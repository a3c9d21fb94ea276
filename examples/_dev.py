"""Dev mode shared by the examples: run an agent once against a fake upstream behind the LLM proxy, print span trees."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from rich.console import Console
from rich.tree import Tree

from agentlightning import LLM, Trainer, semconv
from agentlightning.adapter.tree import build_call_tree
from agentlightning.store.base import LightningStore
from agentlightning.types import Span


@contextlib.asynccontextmanager
async def proxy_on_loop(store: LightningStore, upstream_url: str) -> AsyncIterator[tuple[str, Any]]:
    """Serve the LLM proxy in front of ``upstream_url`` on this event loop (it shares ``store`` with the runners)."""
    import uvicorn

    from agentlightning.proxy import create_proxy_app

    app = create_proxy_app(store, upstream_url)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve(), name="dev-llm-proxy")
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"the LLM proxy failed to start on port {port}")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def span_label(span: Span) -> str:
    """One line per span: name, then the attribute that tells most (agent, tool, model, reward, token counts)."""
    attrs = span.attributes
    parts = [f"[bold]{span.name}[/bold]"]
    agent = attrs.get(semconv.GEN_AI_AGENT_NAME)
    if agent:
        parts.append(f"agent={agent}")
    tool = attrs.get(semconv.GEN_AI_TOOL_NAME)
    if tool:
        parts.append(f"tool={tool}")
    prompt_ids = attrs.get(semconv.PROMPT_TOKEN_IDS)
    if isinstance(prompt_ids, list | tuple):
        parts.append(f"prompt_tokens={len(prompt_ids)}")
    rewards = {
        k.removeprefix(semconv.REWARD_PREFIX): v for k, v in attrs.items() if k.startswith(semconv.REWARD_PREFIX)
    }
    if rewards:
        parts.append("reward " + ", ".join(f"{k}={v}" for k, v in rewards.items()))
    source = attrs.get(semconv.SPAN_SOURCE)
    if source:
        parts.append(f"[dim]({source})[/dim]")
    return " ".join(parts)


def span_tree(spans: Sequence[Span], title: str) -> Tree:
    """The spans of one attempt as a rich tree (parents from span ids; orphans listed at the root)."""
    tree = build_call_tree(list(spans))
    root = Tree(title)

    def add(node: Tree, span_id: str) -> None:
        branch = node.add(span_label(tree.spans[span_id]))
        for child in tree.children.get(span_id, []):
            add(branch, child)

    for span_id in tree.roots:
        add(root, span_id)
    return root


async def print_span_trees(store: LightningStore, rollout_ids: Sequence[str], console: Console) -> list[Tree]:
    """Print (and return) the span tree of each rollout's latest attempt."""
    trees: list[Tree] = []
    for rollout_id in rollout_ids:
        spans = await store.query_spans(rollout_id, "latest")
        trees.append(span_tree(spans, f"rollout {rollout_id}"))
        console.print(trees[-1])
    return trees


async def run_dev(
    agent: Any,
    tasks: Sequence[Any],
    reply: Callable[[Any], Any],
    *,
    n_tasks: int,
    instrumentation: Any,
    console: Console | None = None,
    timeout_s: float = 60,
    store: LightningStore | None = None,
) -> tuple[list[Any], list[Tree]]:
    """Run ``n_tasks`` of ``tasks`` (spread over the list) once with ``agent`` against a fake upstream scripted by
    ``reply``, through the LLM proxy.

    ``instrumentation`` is the example's integration module (``instrument()``/``uninstrument()``); it is installed
    for the run only. Prints what the trainer would see and each rollout's span tree; returns both. ``store``
    (default: a new in-memory one) keeps the spans for a caller to inspect.
    """
    from agentlightning.proxy import flush_proxy_spans
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.testing.fake_openai import FakeOpenAI

    console = console or Console()
    chosen = list(tasks)[:: max(1, len(tasks) // n_tasks)][:n_tasks]
    store = store if store is not None else InMemoryLightningStore()
    instrumentation.instrument()
    try:
        with FakeOpenAI(reply=reply).serve() as upstream:
            async with proxy_on_loop(store, upstream.base_url) as (proxy_url, proxy_app):
                await store.add_resources({"llm": LLM(base_url=proxy_url, model="fake", proxied=True)})
                rows = await Trainer(store=store, n_runners=2, console=console).dev_async(
                    agent, chosen, timeout_s=timeout_s
                )
                await flush_proxy_spans(proxy_app)
                trees = await print_span_trees(store, [r.rollout_id for r in rows], console)
    finally:
        instrumentation.uninstrument()
    return rows, trees
