"""``check_store`` on a real InMemoryLightningStore holding deliberately broken rollouts."""

from __future__ import annotations

import io

from rich.console import Console

from agentlightning import semconv
from agentlightning.adapter import CheckReport, check_store
from agentlightning.adapter.check import FIX_LONE_LOG_RECORDS
from agentlightning.conventions import LOG_BODY, LOG_EVENT_NAME, LOG_SOURCE
from agentlightning.store import InMemoryLightningStore
from agentlightning.types import Rollout
from tests.core.adapter.builders import TraceBuilder


async def record(store: InMemoryLightningStore, build: TraceBuilder | None) -> Rollout:
    """Enqueue, claim and run one rollout whose attempt records the builder's spans."""
    rollout = await store.enqueue_rollout({"task": 1})
    claimed = await store.claim_rollout("worker-1")
    assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
    attempt = claimed.attempt
    await store.start_attempt(rollout.rollout_id, attempt.attempt_id)
    if build is not None:
        for span in build.spans:
            span.rollout_id, span.attempt_id = rollout.rollout_id, attempt.attempt_id
        await store.add_spans(build.spans)
    await store.finish_attempt(rollout.rollout_id, attempt.attempt_id, "succeeded")
    return rollout


def good(agent: str = "writer") -> TraceBuilder:
    b = TraceBuilder()
    root = b.agent(agent, start=0, end=10**9)
    b.llm(parent=root, prompt=list(range(10)), response=[1, 2, 3])
    b.reward(1.0)
    return b


def no_token_ids() -> TraceBuilder:
    b = TraceBuilder()
    root = b.agent("writer", start=0, end=10**9)
    b.llm(parent=root, source="hook")
    b.reward(1.0)
    return b


def no_reward() -> TraceBuilder:
    b = TraceBuilder()
    root = b.agent("writer", start=0, end=10**9)
    b.llm(parent=root, prompt=[1], response=[2])
    return b


def wrong_agents() -> TraceBuilder:
    b = TraceBuilder()
    for name in ("planner", "critic"):
        root = b.agent(name, start=b.clock, end=b.clock + 10_000)
        b.llm(parent=root, prompt=[1], response=[2])
    b.reward(1.0)
    return b


def no_calls() -> TraceBuilder:
    b = TraceBuilder()
    b.agent("writer")
    b.reward(1.0)
    return b


def render(report: CheckReport) -> str:
    console = Console(file=io.StringIO(), width=250, record=True, color_system=None)
    report.render(console)
    return console.export_text()


async def test_check_reports_each_broken_rollout_with_its_fix() -> None:
    store = InMemoryLightningStore()
    ok = await record(store, good())
    ids = await record(store, no_token_ids())
    reward = await record(store, no_reward())
    agents = await record(store, wrong_agents())
    calls = await record(store, no_calls())
    empty = await record(store, None)
    report = await check_store(store, agents="writer", max_prompt_tokens=5)
    by_id = {r.rollout_id: r for r in report.rollouts}
    assert len(by_id) == 6

    assert by_id[ok.rollout_id].calls_found == 1 and by_id[ok.rollout_id].calls_selected == 1
    assert by_id[ok.rollout_id].long_prompts == 1
    assert by_id[ok.rollout_id].problems == [
        "1 prompt over max_prompt_tokens=5 (longest 10): raise the limit or shorten the agent's context "
        "(fewer turns, truncated tool results)"
    ]
    assert by_id[ids.rollout_id].problems == [
        "no token ids: route the agent's LLM calls through the proxy (LLM.base_url_for) or use an upstream that "
        "returns token ids; or re-tokenise them with the trained model's tokenizer: agl check --policy SPEC says "
        "whether that drifts"
    ]
    assert by_id[reward.rollout_id].problems == [
        "no reward: return a float from the rollout function or call emit_reward(...)"
    ]
    assert by_id[agents.rollout_id].problems == ["no calls matched agent 'writer'; agents seen: critic, planner"]
    assert by_id[agents.rollout_id].calls_found == 2 and by_id[agents.rollout_id].calls_selected == 0
    assert by_id[calls.rollout_id].problems[0].startswith("no LLM calls found")
    assert by_id[empty.rollout_id].problems[0].startswith("no spans recorded")
    assert not any(r.trainable for r in report.rollouts)  # the one good rollout's prompt is too long
    assert not report.trainable

    relaxed = await check_store(store, agents="writer")
    assert relaxed.trainable
    assert [r.rollout_id for r in relaxed.rollouts if r.trainable] == [ok.rollout_id]
    assert relaxed.summary() == "1 of 6 rollouts trainable (1 call) for agent 'writer'"

    text = render(report)
    assert "agl check: agent 'writer'" in text
    assert "no calls matched agent 'writer'; agents seen: critic, planner" in text
    assert "0 of 6 rollouts trainable" in text


async def test_check_filters_rollout_ids_and_limit() -> None:
    store = InMemoryLightningStore()
    first = await record(store, good())
    await record(store, good("critic"))
    report = await check_store(store, rollout_ids=[first.rollout_id, "ro-missing"], max_response_tokens=2)
    assert [r.rollout_id for r in report.rollouts] == [first.rollout_id]
    assert report.missing_rollout_ids == ["ro-missing"]
    assert report.rollouts[0].long_responses == 1
    assert "ro-missing: not found in the store" in report.problems
    assert "not found in the store" in render(report)
    limited = await check_store(store, limit=1)
    assert len(limited.rollouts) == 1 and limited.trainable


async def test_check_explains_unjoinable_twins_and_unnamed_agents() -> None:
    store = InMemoryLightningStore()
    b = TraceBuilder()
    b.llm(source="proxy", prompt=[1], response=[2])  # the proxy twin
    b.llm(source="hook")  # the hook twin lacks gen_ai.response.id
    b.reward(1.0)
    await record(store, b)
    report = await check_store(store, agents="writer")
    (line,) = report.rollouts[0].problems
    assert line == (
        "no calls matched agent 'writer'; agents seen: none (2 calls without an agent name: the integration must "
        "set gen_ai.agent.name on LLM or agent spans)"
    )
    everything = await check_store(store)
    assert "1 hook span without gen_ai.response.id cannot be joined" in everything.rollouts[0].problems[0]
    assert everything.trainable


async def test_check_reports_genai_log_records_whose_span_never_arrived() -> None:
    store = InMemoryLightningStore()
    b = good()
    lost = "00000000000000ff"  # an LLM span the sampler dropped or the traces exporter never sent
    for event in ("gen_ai.user.message", "gen_ai.choice"):
        b.add(
            event, {semconv.SPAN_SOURCE: LOG_SOURCE, LOG_EVENT_NAME: event, LOG_BODY: '{"content": "hi"}'}, parent=lost
        )
    b.add("app.audit", {semconv.SPAN_SOURCE: LOG_SOURCE, LOG_EVENT_NAME: "app.audit"}, parent=lost)  # not GenAI
    here = {semconv.SPAN_SOURCE: LOG_SOURCE, LOG_EVENT_NAME: "gen_ai.user.message", LOG_BODY: '{"content": "hi"}'}
    b.add("gen_ai.user.message", dict(here), parent=b.spans[1].span_id)  # its span is here: folded, not reported
    await record(store, b)
    report = await check_store(store)
    (line,) = report.rollouts[0].problems
    assert line.startswith("2 GenAI log records whose LLM span never arrived (1 span missing): their messages train")
    assert line.endswith(FIX_LONE_LOG_RECORDS) and "OTEL_TRACES_SAMPLER=always_on" in line
    assert report.trainable  # the call whose span arrived still trains
