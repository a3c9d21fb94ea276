"""Adapter benchmark (not a test): spans → transitions throughput of ``TraceAdapter.adapt``.

Run: ``.venv/bin/python -m bench.adapter`` (``--quick`` for a smaller run). Each rollout is a three-agent crew
(root, 3 agent spans, 6 LLM calls each recorded twice — by the proxy with 512 prompt / 128 response token ids and
logprobs, and by the framework hook with chat messages — 6 tool spans, 3 intermediate rewards and the returned
reward: 26 spans). A batch is 512 rollouts (64 tasks x 8 samples, a usual GRPO batch), built beforehand as the
store returns them; the timer covers tree building, the proxy/hook join, agent selection, credit assignment and
``Transition`` construction, then GRPO over the batch. Prints the median of several rounds, in CPU time (this
process's own work; the machine is shared, so wall time measures the neighbours) and in wall time.
Target (issue 6): >= 100,000 spans/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from agentlightning import semconv
from agentlightning.adapter import TraceAdapter, grpo_advantages
from agentlightning.types import AttributeValue, Rollout, Span, Transition

TARGET_SPANS_PER_S = 100_000.0
_AGENTS = ("planner", "writer", "critic")


def make_rollout(index: int) -> tuple[Rollout, list[Span]]:
    """One crew rollout's spans (26), as ``query_spans`` returns them (sequence order)."""
    rollout_id, attempt_id = f"ro-{index:08x}", f"at-{index:08x}"
    spans: list[Span] = []
    clock = [1_000_000 * index]

    def add(name: str, attributes: dict[str, AttributeValue], parent: str | None, span_id: str) -> str:
        clock[0] += 1_000
        spans.append(
            Span(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                sequence_id=len(spans) + 1,
                trace_id=f"{index:032x}",
                span_id=span_id,
                parent_id=parent,
                name=name,
                start_time=clock[0],
                end_time=clock[0] + 500,
                attributes=attributes,
            )
        )
        return span_id

    prompt = list(range(512))
    response = list(range(1000, 1128))
    logprobs = [-0.5] * 128
    messages = json.dumps([{"role": "system", "content": "You are helpful. " * 10}, {"role": "user", "content": "q"}])
    output = json.dumps([{"role": "assistant", "content": "an answer " * 20}])
    root = add("crew", {}, None, f"{index:08x}00000000")
    call = 0
    for agent_index, agent in enumerate(_AGENTS):
        agent_span = add(
            f"invoke_agent {agent}",
            {semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT, semconv.GEN_AI_AGENT_NAME: agent},
            root,
            f"{index:08x}{agent_index + 1:08x}",
        )
        for _ in range(2):
            call += 1
            response_id = f"chatcmpl-{index}-{call}"
            add(
                "chat policy",
                {
                    semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
                    semconv.SPAN_SOURCE: semconv.SOURCE_PROXY,
                    semconv.GEN_AI_RESPONSE_ID: response_id,
                    semconv.PROMPT_TOKEN_IDS: prompt,
                    semconv.RESPONSE_TOKEN_IDS: response,
                    semconv.RESPONSE_LOGPROBS: logprobs,
                    semconv.POLICY_VERSION: 3,
                },
                None,
                f"{index:08x}{0x100 + call:08x}",
            )
            add(
                "chat policy",
                {
                    semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
                    semconv.SPAN_SOURCE: semconv.SOURCE_HOOK,
                    semconv.GEN_AI_RESPONSE_ID: response_id,
                    semconv.GEN_AI_INPUT_MESSAGES: messages,
                    semconv.GEN_AI_OUTPUT_MESSAGES: output,
                },
                agent_span,
                f"{index:08x}{0x200 + call:08x}",
            )
            add(
                "execute_tool search",
                {semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL, semconv.GEN_AI_TOOL_NAME: "search"},
                agent_span,
                f"{index:08x}{0x300 + call:08x}",
            )
        add(
            semconv.SPAN_REWARD,
            {semconv.reward_attribute("value"): 0.5, semconv.REWARD_PRIMARY: "value"},
            agent_span,
            f"{index:08x}{0x400 + agent_index:08x}",
        )
    add(
        semconv.SPAN_REWARD,
        {semconv.reward_attribute("value"): float(index % 2), semconv.REWARD_PRIMARY: "value"},
        root,
        f"{index:08x}{0x500:08x}",
    )
    rollout = Rollout(rollout_id=rollout_id, input=None, group_id=f"task-{index // 8}", enqueue_time=0)
    return rollout, spans


def run_once(adapter: TraceAdapter, data: list[tuple[Rollout, list[Span]]]) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, transitions) for adapting every rollout, then GRPO over the whole batch."""
    cpu, wall = time.process_time(), time.perf_counter()
    rows: list[Transition] = []
    for rollout, spans in data:
        rows.extend(adapter.adapt(rollout, spans))
    grpo_advantages(rows)
    return time.process_time() - cpu, time.perf_counter() - wall, len(rows)


def measure(name: str, make: Callable[[], TraceAdapter], data: list[tuple[Rollout, list[Span]]], rounds: int) -> float:
    """Print and return the median CPU-time spans/s of ``rounds`` runs."""
    spans = sum(len(s) for _, s in data)
    adapter = make()
    run_once(adapter, data[: max(1, len(data) // 10)])  # warm caches (selector, imports)
    results = [run_once(adapter, data) for _ in range(rounds)]
    cpu_rate = spans / statistics.median(r[0] for r in results)
    wall_rate = spans / statistics.median(r[1] for r in results)
    print(
        f"{name:<44} {cpu_rate:>10,.0f} spans/s CPU {wall_rate:>10,.0f} spans/s wall"
        f"  ({results[0][2]:,} transitions from {spans:,} spans)"
    )
    return cpu_rate


def main() -> None:
    """Run the benchmark and print spans/s per adapter configuration against the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and rounds")
    parser.add_argument("--rollouts", type=int, default=512, help="rollouts per batch")
    args = parser.parse_args()
    rollouts, rounds = (128, 3) if args.quick else (args.rollouts, 9)
    data = [make_rollout(i) for i in range(rollouts)]
    configs: list[tuple[str, Callable[[], TraceAdapter]]] = [
        ("RL: agents=writer, per_call, no messages", lambda: TraceAdapter("writer", include_messages=False)),
        ("RL: all agents, per_call, no messages", lambda: TraceAdapter(include_messages=False)),
        (
            "RL: all agents, discounted, aggregated",
            lambda: TraceAdapter(credit="discounted", gamma=0.9, aggregate_trajectories=True, include_messages=False),
        ),
        ("text: all agents, identical, with messages", lambda: TraceAdapter(credit="identical")),
    ]
    rates = [measure(name, make, data, rounds) for name, make in configs]
    worst = min(rates)
    verdict = "meets" if worst >= TARGET_SPANS_PER_S else "misses"
    print(f"slowest configuration: {worst:,.0f} spans/s; {verdict} the target of {TARGET_SPANS_PER_S:,.0f} spans/s")


if __name__ == "__main__":
    main()
