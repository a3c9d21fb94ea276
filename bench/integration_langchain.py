"""LangChain integration benchmark (not a test): what LightningCallbackHandler adds to one LLM call.

Run: ``.venv/bin/python -m bench.integration_langchain`` (``--quick`` for a smaller run). A fake chat model (no I/O)
is invoked inside a rollout without a handler, with an explicit handler, and with the zero-line hook; the difference
per call is the handler's cost, including LangChain's dispatch to it and the span's trip through the tracing
pipeline (CPU time of the whole process, so the exporter thread's work counts). Two more modes split that cost:
a LangChain no-op handler (LangChain's own dispatch) and our handler with an OpenTelemetry no-op tracer (our code,
without recording the span and the pipeline). CPU time rather than wall time is the headline because the benchmark
machines are shared; wall time is printed too. Prints the median of several rounds.
Target (issue 9): < 100 µs per LLM call.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from opentelemetry.trace import NoOpTracer

import agentlightning_langchain
from agentlightning.tracing import LightningTracer, init_tracing, rollout_context, shutdown_tracing
from agentlightning.types.spans import Span
from agentlightning_langchain import LightningCallbackHandler

TARGET_US = 100.0


class _DiscardSink:
    """A sink that accepts and forgets spans, so the benchmark measures capture, not storage."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Span]) -> None:
        """Count the batch."""
        self.spans += len(spans)


def _model() -> GenericFakeChatModel:
    answer = AIMessage(
        "The capital of France is Paris.",
        id="chatcmpl-bench",
        usage_metadata={"input_tokens": 24, "output_tokens": 8, "total_tokens": 32},
        response_metadata={"finish_reason": "stop", "model_name": "fake"},
    )
    return GenericFakeChatModel(messages=itertools.repeat(answer))


PROMPT: list[BaseMessage] = [
    SystemMessage("You are a geography tutor. Answer in one sentence."),
    HumanMessage("What is the capital of France?"),
]


def _per_call_us(call: Callable[[], Any], calls: int, tracer: LightningTracer) -> tuple[float, float]:
    """(wall, CPU) µs per call, up to the delivery of the last span; CPU is the whole process's."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    tracer.flush()
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


class _NoopHandler(BaseCallbackHandler):
    """A handler that does nothing: what LangChain itself spends dispatching callbacks to any handler."""

    run_inline = True


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print µs per LLM call without a handler, with ours, and the parts of the difference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args(argv)
    calls, rounds = (300, 3) if args.quick else (2000, 7)

    sink = _DiscardSink()
    tracer = init_tracing(sink)
    model = _model()

    def with_callback(handler: BaseCallbackHandler) -> Callable[[], Any]:
        config: Any = {"callbacks": [handler]}
        return lambda: model.invoke(PROMPT, config)

    # name -> (call, is the handler measured against the target)
    modes: dict[str, tuple[Callable[[], Any], bool]] = {
        "no handler": (lambda: model.invoke(PROMPT), False),
        "LangChain no-op handler": (with_callback(_NoopHandler()), False),
        "ours, no-op tracer": (with_callback(LightningCallbackHandler(tracer=NoOpTracer())), False),
        "ours (callbacks=[...])": (with_callback(LightningCallbackHandler()), True),
        "ours (instrument())": (lambda: model.invoke(PROMPT), True),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    try:
        with rollout_context("ro-bench", "at-bench"):
            for call, _ in modes.values():
                _per_call_us(call, calls // 10, tracer)  # warm up caches and lazy imports
            for _ in range(rounds):
                # Interleave the modes so that machine noise hits them alike.
                for name, (call, _) in modes.items():
                    if name == "ours (instrument())":
                        agentlightning_langchain.instrument()
                    try:
                        results[name].append(_per_call_us(call, calls, tracer))
                    finally:
                        agentlightning_langchain.uninstrument()
    finally:
        shutdown_tracing()

    def median(name: str, index: int) -> float:
        return statistics.median(sample[index] for sample in results[name])

    print(f"LangChain handler cost per LLM call ({calls} calls x {rounds} rounds, medians; CPU = whole process,")
    print("including the exporter thread; overhead = CPU minus 'no handler'):")
    print(f"  {'mode':<24} {'wall µs':>8} {'CPU µs':>8} {'overhead µs':>12}")
    base = median("no handler", 1)
    for name, (_, targeted) in modes.items():
        cpu = median(name, 1)
        line = f"  {name:<24} {median(name, 0):8.1f} {cpu:8.1f}"
        if name != "no handler":
            line += f" {cpu - base:12.1f}"
        if targeted:
            line += f"   target < {TARGET_US:.0f} µs: {'ok' if cpu - base < TARGET_US else 'OVER'}"
        print(line)
    print(f"  spans delivered: {sink.spans}, dropped: {tracer.dropped_spans}")


if __name__ == "__main__":
    main()
