"""Co-hosted LLM proxy benchmark (not a test): the proxy in the policy server's process calling the policy in process
(``policy_transport.py``) against the same proxy calling it over loopback HTTP (httpx-compatible HTTP/1.1, the path
before), in one run.

Run: ``.venv/bin/python -m bench.cohosted_proxy`` (``--quick`` for a smaller run). Each mode starts the policy server
as the trainer does (``PolicyServerProcess`` with ``proxy_store``: the tiny GPT of the tool-choice task, spans into a
SQLite store) and sends the quickstart agent's chat request (up to 8 tokens) through the proxy: sequential calls
for the latency, then 32 concurrent keep-alive clients for the calls/s and the server process's CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

import orjson

from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.types import RolloutRequest
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.policy_process import PolicyServerProcess
from bench.proxy import _cpu_s, _latencies, _quantile, _throughput  # pyright: ignore[reportPrivateUsage]

CLIENTS = 32


async def _attempt_path(store_file: Path) -> str:
    """A running attempt's proxy route (the proxy records the calls as that attempt's spans)."""
    store = SqliteLightningStore(store_file)
    try:
        await store.enqueue_rollouts([RolloutRequest(input={"task": "bench"})])
        claimed = await store.claim_and_start("bench")
        assert claimed is not None
        return f"/rollout/{claimed.rollout.rollout_id}/attempt/{claimed.attempt.attempt_id}/v1/chat/completions"
    finally:
        await store.close()


def _measure(in_process: bool, calls: int, seconds: float, body: bytes) -> tuple[float, float, float]:
    """(p50 latency s, calls/s at CLIENTS clients, server CPU s per call) of one mode."""
    with tempfile.TemporaryDirectory(prefix="bench-cohosted-") as tmp:
        store_file = Path(tmp) / "store.db"
        path = asyncio.run(_attempt_path(store_file))
        spec = PolicySpec(words=tool_choice.vocabulary())
        server = PolicyServerProcess(
            spec, None, spec_file=Path(tmp) / "spec.json", proxy_store=store_file, proxy_in_process=in_process
        )
        with server:
            assert server.proxy_port is not None and server._proc is not None  # pyright: ignore[reportPrivateUsage]
            pid = server._proc.pid  # pyright: ignore[reportPrivateUsage]
            latencies = asyncio.run(_latencies(server.proxy_port, path, calls, body))
            before = _cpu_s(pid)
            rate = asyncio.run(_throughput(server.proxy_port, path, CLIENTS, seconds, body))
            cpu = (_cpu_s(pid) - before) / (rate * seconds)
    return _quantile(latencies, 0.5), rate, cpu


def main() -> None:
    """Measure both modes and print them with the in-process transport's ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = parser.parse_args()
    calls, seconds = (200, 2.0) if args.quick else (1000, 6.0)
    task = tool_choice.tasks()[0]
    body = orjson.dumps({"model": "tiny-gpt", "messages": tool_choice.messages(task), "max_tokens": 8})
    http = _measure(False, calls, seconds, body)
    direct = _measure(True, calls, seconds, body)
    ms = 1000.0
    print(f"Co-hosted LLM proxy -> policy ({calls} sequential calls; {seconds:.0f} s at {CLIENTS} concurrent clients)")
    for name, (p50, rate, cpu) in (("over loopback HTTP (baseline)", http), ("in process", direct)):
        print(f"  {name:<30} p50 {p50 * ms:6.2f} ms  {rate:7,.0f} calls/s  server CPU {cpu * ms:.2f} ms/call")
    print(
        f"  in process vs HTTP: p50 latency {http[0] / direct[0]:.2f}x lower, {direct[1] / http[1]:.2f}x the calls/s, "
        f"{http[2] / direct[2]:.2f}x less server CPU per call (load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
