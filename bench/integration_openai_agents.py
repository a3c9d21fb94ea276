"""OpenAI Agents SDK integration benchmark (not a test): what LightningTracingProcessor adds to one LLM call.

Run: ``.venv/bin/python -m bench.integration_openai_agents`` (``--quick`` for a smaller run). Two measurements, each
inside a rollout, without and with ``instrument()``, interleaved over several rounds (median printed):

- **generation span**: the SDK's own span of one LLM call as its built-in models write it (chat messages in and out,
  usage, model), opened and closed inside an agent span; the difference is the processor's cost per LLM call.
- **agent run**: ``Runner.run`` of an agent whose fake model (the SDK's ``ScriptedModel``, a custom ``Model``)
  answers at once, recorded through ``LightningRunHooks``; the difference is the cost of a whole one-call run
  (root, agent and LLM spans), an upper bound on the cost per call.

CPU time is the whole process's, so the exporter thread delivering spans to a discarding sink is counted, as it
competes for the GIL in production. Target (issue 11): < 100 µs per LLM call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from agents import Agent, Runner, set_trace_processors
from agents.testing import ScriptedModel, assistant_message
from agents.tracing import agent_span, generation_span, trace

import agentlightning_openai_agents
from agentlightning.tracing import LightningTracer, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types.spans import Span
from agentlightning_openai_agents import LightningRunHooks

TARGET_US = 100.0

PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a geography tutor. Answer in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]
ANSWER: list[dict[str, Any]] = [{"role": "assistant", "content": "The capital of France is Paris.", "tool_calls": None}]
USAGE: dict[str, Any] = {"requests": 1, "input_tokens": 24, "output_tokens": 8, "total_tokens": 32}


class _DiscardSink:
    """A sink that accepts and forgets spans, so the benchmark measures capture, not storage."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Span]) -> None:
        """Count the batch."""
        self.spans += len(spans)


def _generation_spans(calls: int) -> None:
    """``calls`` LLM-call spans as the built-in models write them, in one agent span of one trace."""
    with trace("bench"), agent_span("tutor"):
        for _ in range(calls):
            with generation_span(input=PROMPT, model="fake-model", model_config={"temperature": 0.0}) as span:
                span.span_data.output = ANSWER
                span.span_data.usage = USAGE


def _agent_runs(calls: int) -> None:
    """``calls`` one-call runs of an agent on a scripted (custom) model, with LightningRunHooks."""
    model = ScriptedModel([[assistant_message("The capital of France is Paris.")] for _ in range(calls)])
    agent = Agent(name="tutor", instructions="You are a geography tutor. Answer in one sentence.", model=model)
    hooks = LightningRunHooks()

    async def run_all() -> None:
        for _ in range(calls):
            await Runner.run(agent, "What is the capital of France?", hooks=hooks)

    asyncio.run(run_all())


def _per_call_us(work: Callable[[int], None], calls: int, tracer: LightningTracer) -> tuple[float, float, float]:
    """(wall, process CPU, agent-thread CPU) µs per call, up to the delivery of the last span."""
    wall, cpu, agent = time.perf_counter(), time.process_time(), time.thread_time()
    work(calls)
    agent = time.thread_time() - agent
    tracer.flush()
    return (
        (time.perf_counter() - wall) / calls * 1e6,
        (time.process_time() - cpu) / calls * 1e6,
        agent / calls * 1e6,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print µs per LLM call without and with the processor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else 7
    workloads: dict[str, tuple[Callable[[int], None], int]] = {
        "generation span": (_generation_spans, 500 if args.quick else 3000),
        "agent run": (_agent_runs, 100 if args.quick else 400),
    }

    sink = _DiscardSink()
    tracer = init_tracing(sink)
    set_trace_processors([])  # no default exporter: nothing may leave the machine, and it is not what we measure
    results: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    try:
        with rollout_context("ro-bench", "at-bench"):
            for name, (work, calls) in workloads.items():
                for instrumented in (False, True):
                    if instrumented:
                        agentlightning_openai_agents.instrument()
                    try:
                        _per_call_us(work, max(calls // 10, 1), tracer)  # warm up caches and lazy imports
                        for _ in range(rounds):
                            results.setdefault((name, instrumented), []).append(_per_call_us(work, calls, tracer))
                    finally:
                        agentlightning_openai_agents.uninstrument()
    finally:
        shutdown_tracing()

    def median(key: tuple[str, bool], index: int) -> float:
        return statistics.median(sample[index] for sample in results[key])

    print(f"OpenAI Agents SDK processor cost per LLM call ({rounds} rounds, median µs):")
    print("  CPU = whole process (agent thread + span exporter thread); agent = the agent's thread alone")
    print(f"  {'workload':<16} {'mode':<18} {'wall':>8} {'CPU':>8} {'agent':>8} {'overhead CPU / agent':>22}")
    for name, (_, calls) in workloads.items():
        base_cpu, base_agent = median((name, False), 1), median((name, False), 2)
        for instrumented in (False, True):
            key = (name, instrumented)
            cpu, agent = median(key, 1), median(key, 2)
            mode = "with processor" if instrumented else "without processor"
            line = f"  {name:<16} {mode:<18} {median(key, 0):8.1f} {cpu:8.1f} {agent:8.1f}"
            if instrumented:
                line += f" {cpu - base_cpu:10.1f} / {agent - base_agent:6.1f} µs"
                if name == "generation span":
                    verdict = "ok" if cpu - base_cpu < TARGET_US else "OVER TARGET"
                    line += f"  per LLM call (target < {TARGET_US:.0f} µs CPU: {verdict})"
                else:
                    line += "  per one-call run (root + agent + LLM span)"
            print(line)
        print(f"  {'':<16} ({calls} calls per round)")
    print(f"  spans delivered: {sink.spans}, dropped: {tracer.dropped_spans}")


if __name__ == "__main__":
    main()
