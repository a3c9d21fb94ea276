"""AutoGen integration benchmark (not a test): what ``agentlightning_autogen.instrument()`` adds to one LLM call.

Run: ``.venv/bin/python -m bench.integration_autogen`` (``--quick`` for a smaller run). A ``ReplayChatCompletionClient``
(no I/O) answers ``create`` calls inside a rollout and inside an AutoGen ``invoke_agent`` span, as an agent's model
calls are, with and without ``instrument()``; the difference per call is the integration's cost: the wrapper, the
attribute conversion (messages, tools, output, usage), the LLM span and its trip through the tracing pipeline (CPU
time of the whole process, so the exporter thread's work counts). ``create_stream`` is measured the same way. CPU time
rather than wall time is the headline because the benchmark machines are shared; wall time is printed too. Prints the
median of several rounds. Target (issue 10): < 100 µs per LLM call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

from autogen_core import trace_invoke_agent_span
from autogen_core.models import LLMMessage, ModelInfo, SystemMessage, UserMessage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient

import agentlightning_autogen
from agentlightning.tracing import LightningTracer, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types.spans import Span

TARGET_US = 100.0

PROMPT: list[LLMMessage] = [
    SystemMessage(content="You are a geography tutor. Answer in one sentence."),
    UserMessage(content="What is the capital of France?", source="user"),
]
ANSWER = "The capital of France is Paris."
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)


def _lookup(city: str) -> str:
    """Look up facts about a city."""
    return city


TOOLS = [FunctionTool(_lookup, description="Look up facts about a city.")]


class _DiscardSink:
    """A sink that accepts and forgets spans, so the benchmark measures capture, not storage."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Span]) -> None:
        """Count the batch."""
        self.spans += len(spans)


async def _create(client: ReplayChatCompletionClient) -> None:
    await client.create(PROMPT, tools=TOOLS)


async def _create_stream(client: ReplayChatCompletionClient) -> None:
    async for _ in client.create_stream(PROMPT, tools=TOOLS):
        pass


async def _per_call_us(
    call: Callable[[ReplayChatCompletionClient], Awaitable[None]], calls: int, tracer: LightningTracer
) -> tuple[float, float]:
    """(wall, CPU) µs per call, up to the delivery of the last span; CPU is the whole process's."""
    client = ReplayChatCompletionClient([ANSWER] * calls, model_info=MODEL_INFO)
    wall, cpu = time.perf_counter(), time.process_time()
    with trace_invoke_agent_span("tutor"):
        for _ in range(calls):
            await call(client)
    await asyncio.to_thread(tracer.flush)
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


async def _measure(calls: int, rounds: int, tracer: LightningTracer) -> dict[str, list[tuple[float, float]]]:
    modes: dict[str, tuple[Callable[[ReplayChatCompletionClient], Awaitable[None]], bool]] = {
        "create, not instrumented": (_create, False),
        "create, instrument()": (_create, True),
        "create_stream, not instrumented": (_create_stream, False),
        "create_stream, instrument()": (_create_stream, True),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    with rollout_context("ro-bench", "at-bench"):
        for call, instrumented in modes.values():  # warm up caches and lazy imports
            if instrumented:
                agentlightning_autogen.instrument()
            try:
                await _per_call_us(call, calls // 10, tracer)
            finally:
                agentlightning_autogen.uninstrument()
        for _ in range(rounds):
            # Interleave the modes so that machine noise hits them alike.
            for name, (call, instrumented) in modes.items():
                if instrumented:
                    agentlightning_autogen.instrument()
                try:
                    results[name].append(await _per_call_us(call, calls, tracer))
                finally:
                    agentlightning_autogen.uninstrument()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print µs per LLM call with and without ``instrument()``, for ``create`` and ``create_stream``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args(argv)
    calls, rounds = (300, 3) if args.quick else (2000, 7)

    sink = _DiscardSink()
    tracer = init_tracing(sink)
    try:
        results = asyncio.run(_measure(calls, rounds, tracer))
    finally:
        shutdown_tracing()

    def median(name: str, index: int) -> float:
        return statistics.median(sample[index] for sample in results[name])

    print(f"AutoGen integration cost per LLM call ({calls} calls x {rounds} rounds, medians; CPU = whole process,")
    print("including the exporter thread; overhead = CPU minus the same call not instrumented):")
    print(f"  {'mode':<32} {'wall µs':>8} {'CPU µs':>8} {'overhead µs':>12}")
    for name in results:
        cpu = median(name, 1)
        line = f"  {name:<32} {median(name, 0):8.1f} {cpu:8.1f}"
        if name.endswith("instrument()"):
            overhead = cpu - median(name.replace("instrument()", "not instrumented"), 1)
            line += f" {overhead:12.1f}   target < {TARGET_US:.0f} µs: {'ok' if overhead < TARGET_US else 'OVER'}"
        print(line)
    print(f"  spans delivered: {sink.spans}, dropped: {tracer.dropped_spans}")


if __name__ == "__main__":
    main()
