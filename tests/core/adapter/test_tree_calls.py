"""Span trees, LLM call discovery and the proxy/hook join."""

from __future__ import annotations

import random

from agentlightning import semconv
from agentlightning.adapter import TraceAdapter, build_call_tree, find_llm_calls, is_llm_span
from agentlightning.types import Rollout
from tests.core.adapter.builders import TraceBuilder

ROLLOUT = Rollout(rollout_id="ro-1", input="task", group_id="task-1", enqueue_time=0)


def test_tree_parents_children_and_walk() -> None:
    b = TraceBuilder()
    root = b.agent("planner", start=0, end=10_000)
    call = b.llm(parent=root)
    tool = b.tool("search", parent=root)
    tree = build_call_tree(list(reversed(b.spans)))  # input order must not matter
    assert tree.roots == [root]
    assert tree.children[root] == [call, tool]
    assert [(depth, span.span_id) for depth, span in tree.walk()] == [(0, root), (1, call), (1, tool)]
    assert [a.span_id for a in tree.ancestors(call)] == [root]
    assert tree.agent_name(tool) == "planner"


def test_agent_name_own_then_nearest_ancestor() -> None:
    b = TraceBuilder()
    outer = b.agent("supervisor", start=0, end=10_000)
    inner = b.agent("writer", parent=outer, start=100, end=9_000)
    chain = b.add("chain step", {}, parent=inner)
    nested = b.llm(parent=chain)
    named = b.llm(parent=chain, agent="explicit")
    calls = {c.span_id: c for c in find_llm_calls(b.spans)}
    assert calls[nested].agent_name == "writer"
    assert calls[named].agent_name == "explicit"


def test_missing_parent_falls_back_to_enclosing_agent_by_time() -> None:
    b = TraceBuilder()
    b.agent("planner", start=0, end=5_000)
    writer = b.agent("writer", start=5_000, end=90_000)
    # The chain span between the writer and its call was dropped: the call names a parent that never arrived.
    orphan = b.llm(parent="deadbeefdeadbeef", start=6_000, end=7_000)
    proxy_root = b.llm(start=8_000, end=8_500)  # a proxy span without trace context
    tree = build_call_tree(b.spans)
    assert orphan in tree.orphans and orphan in tree.roots
    assert tree.agent_name(orphan) == "writer"
    assert tree.agent_name(proxy_root) == "writer"
    assert tree.agent_name(writer) == "writer"


def test_intact_chain_without_agent_does_not_guess() -> None:
    b = TraceBuilder()
    b.agent("writer", start=0, end=90_000)
    workflow = b.add("workflow", {}, start=10, end=80_000)
    call = b.llm(parent=workflow)
    assert build_call_tree(b.spans).agent_name(call) is None


def test_parent_cycle_does_not_hang() -> None:
    b = TraceBuilder()
    b.add("a", {}, span_id="000000000000000a", parent="000000000000000b")
    b.add("b", {}, span_id="000000000000000b", parent="000000000000000a")
    tree = build_call_tree(b.spans)
    assert tree.agent_name("000000000000000a") is None
    assert len(list(tree.walk())) <= 2


def test_proxy_and_hook_twins_join_into_one_transition() -> None:
    b = TraceBuilder()
    agent = b.agent("writer", start=0, end=100_000)
    b.llm(
        response_id="chatcmpl-1",
        source=semconv.SOURCE_PROXY,
        prompt=[1, 2],
        response=[3, 4],
        logprobs=[-0.1, -0.2],
        version=7,
    )
    hook = b.llm(
        parent=agent,
        response_id="chatcmpl-1",
        source=semconv.SOURCE_HOOK,
        messages=[{"role": "user", "content": "hi"}],
        output=[{"role": "assistant", "content": "yo"}],
    )
    b.reward(1.0)
    calls = find_llm_calls(b.spans)
    assert len(calls) == 1
    call = calls[0]
    assert call.span_id == hook and len(call.span_ids) == 2
    assert set(call.sources) == {"proxy", "hook"}
    rows = TraceAdapter().adapt(ROLLOUT, b.spans)
    assert len(rows) == 1
    row = rows[0]
    assert row.span_id == hook
    assert row.agent_name == "writer"
    assert (row.prompt_token_ids, row.response_token_ids, row.response_logprobs) == ([1, 2], [3, 4], [-0.1, -0.2])
    assert row.policy_version == 7
    assert row.prompt_messages == [{"role": "user", "content": "hi"}]
    assert row.response_messages == [{"role": "assistant", "content": "yo"}]
    assert (row.group_id, row.rollout_id, row.attempt_id, row.reward) == ("task-1", "ro-1", "at-1", 1.0)


def test_calls_without_response_id_stay_separate() -> None:
    b = TraceBuilder()
    b.llm(source="proxy", prompt=[1], response=[2])
    b.llm(source="hook")
    assert len(find_llm_calls(b.spans)) == 2


def test_spans_out_of_order_give_the_same_transitions() -> None:
    b = TraceBuilder()
    root = b.agent("writer", start=0, end=1_000_000)
    for turn in range(5):
        b.llm(parent=root, prompt=[turn], response=[turn + 100])
        b.reward(float(turn))
    expected = [(t.turn_index, t.prompt_token_ids, t.reward) for t in TraceAdapter().adapt(ROLLOUT, b.spans)]
    assert expected == [(i, [i], float(i)) for i in range(5)]
    shuffled = list(b.spans)
    random.Random(7).shuffle(shuffled)
    assert [(t.turn_index, t.prompt_token_ids, t.reward) for t in TraceAdapter().adapt(ROLLOUT, shuffled)] == expected


def test_sequence_order_when_clocks_disagree() -> None:
    b = TraceBuilder()
    # The proxy's clock runs 1 ms behind the agent's: by time the reward would precede its call.
    b.llm(prompt=[1], response=[2], start=500, end=600)
    b.reward(0.25)  # agent clock ~1_000
    b.llm(prompt=[3], response=[4], start=900, end=950)  # arrives (sequence) after the reward
    b.reward(1.0)
    by_sequence = TraceAdapter(order="sequence").adapt(ROLLOUT, b.spans)
    assert [t.reward for t in by_sequence] == [0.25, 1.0]
    by_time = TraceAdapter(order="time").adapt(ROLLOUT, b.spans)
    # By time both calls precede the 0.25 reward, and the final reward falls in the same gap: they add up.
    assert [t.reward for t in by_time] == [1.25, 1.25]


def test_latest_attempt_only() -> None:
    old = TraceBuilder(attempt_id="at-1", clock=0)
    old.llm(prompt=[1], response=[2])
    new = TraceBuilder(attempt_id="at-2", clock=10_000)
    new.llm(prompt=[5], response=[6])
    new.reward(1.0)
    rows = TraceAdapter().adapt(ROLLOUT, [*old.spans, *new.spans])
    assert [(r.attempt_id, r.prompt_token_ids) for r in rows] == [("at-2", [5])]


def test_failed_call_is_reported_and_group_falls_back_to_rollout_id() -> None:
    b = TraceBuilder()
    b.llm(prompt=[1], response=[2], error=True)
    b.reward(0.0)
    assert find_llm_calls(b.spans)[0].failed
    rows = TraceAdapter().adapt(Rollout(rollout_id="ro-9", input=None, enqueue_time=0), b.spans)
    assert rows[0].group_id == "ro-9"


def test_messages_for_text_algorithms_include_system_instructions() -> None:
    b = TraceBuilder()
    call = b.llm(source="hook", messages=[{"role": "user", "content": "2+2?"}])
    b.spans[-1].attributes[semconv.GEN_AI_SYSTEM_INSTRUCTIONS] = '[{"type": "text", "content": "Be brief."}]'
    b.spans[-1].attributes[semconv.GEN_AI_OUTPUT_MESSAGES] = '"4"'
    b.reward(1.0)
    (row,) = TraceAdapter().adapt(ROLLOUT, b.spans)
    assert row.span_id == call and not row.has_token_ids
    assert row.prompt_messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert row.response_messages == [{"role": "assistant", "content": "4"}]
    (bare,) = TraceAdapter(include_messages=False).adapt(ROLLOUT, b.spans)
    assert bare.prompt_messages is None and bare.response_messages is None


def test_is_llm_span_and_non_llm_spans_ignored() -> None:
    b = TraceBuilder()
    b.tool("search")
    b.agent("writer")
    b.llm(prompt=[1], response=[2])
    assert [is_llm_span(s) for s in b.spans] == [False, False, True]
    assert len(find_llm_calls(b.spans)) == 1


def test_hook_without_response_id_joins_the_proxy_call_inside_its_window() -> None:
    # langchain-openai drops the completion id when streaming, so the hook span has none; the proxy span that ran
    # inside the hook span's window is the same call.
    b = TraceBuilder()
    agent = b.agent("writer", start=0, end=1_000_000)
    hook = b.llm(parent=agent, source=semconv.SOURCE_HOOK, start=100, end=900)
    b.llm(response_id="chatcmpl-9", source=semconv.SOURCE_PROXY, prompt=[1], response=[2], start=200, end=800)
    late_hook = b.llm(parent=agent, source=semconv.SOURCE_HOOK, start=2_000, end=3_000)
    calls = find_llm_calls(b.spans)
    assert len(calls) == 2
    joined = next(c for c in calls if c.span_id == hook)
    assert set(joined.sources) == {"proxy", "hook"}
    assert (joined.prompt_token_ids, joined.response_token_ids, joined.response_id) == ([1], [2], "chatcmpl-9")
    assert next(c for c in calls if c.span_id == late_hook).sources == ("hook",)
