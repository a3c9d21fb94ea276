"""Dev mode shared by the examples: run an agent once against a fake upstream behind the LLM proxy, print span trees."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.tree import Tree

from agentlightning import LLM, Trainer, semconv
from agentlightning.adapter.tree import build_call_tree
from agentlightning.store.base import LightningStore
from agentlightning.types import Span


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
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.testing.fake_openai import FakeOpenAI

    console = console or Console()
    chosen = list(tasks)[:: max(1, len(tasks) // n_tasks)][:n_tasks]
    store = store if store is not None else InMemoryLightningStore()
    instrumentation.instrument()
    try:
        with FakeOpenAI(reply=reply).serve() as upstream:
            # Trainer(llm=...) puts the LLM proxy in front of the fake and publishes it, as `agl dev --fake` does.
            llm = LLM(base_url=upstream.base_url, model="fake")
            trainer = Trainer(store=store, n_runners=2, console=console, llm=llm)
            rows = await trainer.dev_async(agent, chosen, timeout_s=timeout_s)
            trees = await print_span_trees(store, [r.rollout_id for r in rows], console)
    finally:
        instrumentation.uninstrument()
    return rows, trees
