"""LLM proxy benchmark (not a test): latency the proxy adds over calling the upstream directly, and throughput.

Run: ``.venv/bin/python -m bench.proxy`` (``--quick`` for a smaller run). The fake upstream and the proxy (with an
in-memory store recording every call) each run in their own process, as in production; the load generator is a
minimal keep-alive HTTP/1.1 client so that its own cost does not hide the proxy's.
Targets (issue 4): p50 added latency < 1 ms; >= 1,000 calls/s through the proxy at 32 concurrent clients.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

import orjson

BODY = orjson.dumps(
    {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that answers briefly."},
            {"role": "user", "content": "What is the capital of France? Answer in one word."},
        ],
        "temperature": 0.7,
    }
)


class RawClient:
    """One keep-alive HTTP/1.1 connection posting JSON; just enough protocol for uvicorn's replies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        """Open a connection to 127.0.0.1:port."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def post(self, path: str, body: bytes) -> bytes:
        """POST ``body``; returns the response body (raises on a non-200 status)."""
        head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        self._writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        status = await self._reader.readline()
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        content = await self._reader.readexactly(length)
        if b" 200 " not in status:
            raise RuntimeError(f"{path} answered {status!r}: {content[:300]!r}")
        return content

    def close(self) -> None:
        """Close the connection."""
        self._writer.close()


def _serve(role: str, upstream_port: int) -> None:
    """Child process: run the fake upstream or the proxy (with a fresh rollout) and print READY <port> <path>."""
    import uvicorn

    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only then; without it Nagle +
    # delayed ACK add ~40 ms to every response uvicorn writes in two sends.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if role == "upstream":
        from agentlightning.testing import FakeOpenAI

        app = FakeOpenAI().app
        path = "/v1/chat/completions"
    else:
        from agentlightning.proxy import create_proxy_app
        from agentlightning.store.memory import InMemoryLightningStore

        store = InMemoryLightningStore()

        async def attempt() -> str:
            await store.enqueue_rollout({"task": "bench"})
            claimed = await store.claim_rollout("bench")
            assert claimed is not None
            return f"/rollout/{claimed.rollout.rollout_id}/attempt/{claimed.attempt.attempt_id}/v1/chat/completions"

        path = asyncio.run(attempt())
        app = create_proxy_app(store, f"http://127.0.0.1:{upstream_port}/v1")
    sock.listen(2048)  # accept connections from the moment READY is printed
    print(f"READY {port} {path}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def _spawn(role: str, upstream_port: int = 0) -> tuple[subprocess.Popen[str], int, str]:
    command = [sys.executable, "-m", "bench.proxy", "--serve", role, "--upstream-port", str(upstream_port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    line = process.stdout.readline().split()
    if not line or line[0] != "READY":
        process.kill()
        raise RuntimeError(f"the {role} process did not start (it printed {line!r}); run it alone to see why")
    return process, int(line[1]), line[2]


async def _latencies(port: int, path: str, calls: int, body: bytes = BODY) -> list[float]:
    client = await RawClient.connect(port)
    try:
        for _ in range(min(200, calls)):  # warm-up: connections, caches, code paths
            await client.post(path, body)
        samples: list[float] = []
        for _ in range(calls):
            began = time.perf_counter()
            await client.post(path, body)
            samples.append(time.perf_counter() - began)
        return samples
    finally:
        client.close()


async def _throughput(port: int, path: str, clients: int, seconds: float, body: bytes = BODY) -> float:
    connections = [await RawClient.connect(port) for _ in range(clients)]
    for connection in connections:
        await connection.post(path, body)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: RawClient) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await client.post(path, body)
            done += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - began
    for connection in connections:
        connection.close()
    return done / elapsed


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far; immune to the scheduling noise of a busy machine."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):  # not Linux: the figure is left out
        return float("nan")


def _quantile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q * 100) - 1] if q < 1 else max(samples)


def main() -> None:
    """Measure and print added latency (p50/p99) and calls/s through the proxy."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--serve", choices=["upstream", "proxy"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.upstream_port)
        return
    calls, seconds = (300, 1.0) if args.quick else (3000, 5.0)
    upstream, upstream_port, upstream_path = _spawn("upstream")
    proxy, proxy_port, proxy_path = _spawn("proxy", upstream_port)
    try:
        direct_lat = asyncio.run(_latencies(upstream_port, upstream_path, calls))
        proxy_lat = asyncio.run(_latencies(proxy_port, proxy_path, calls))
        direct_rate = asyncio.run(_throughput(upstream_port, upstream_path, 32, seconds))
        cpu_before = _cpu_s(proxy.pid), _cpu_s(upstream.pid)
        proxy_rate = asyncio.run(_throughput(proxy_port, proxy_path, 32, seconds))
        proxy_cpu = (_cpu_s(proxy.pid) - cpu_before[0]) / (proxy_rate * seconds) * 1e6
        upstream_cpu = (_cpu_s(upstream.pid) - cpu_before[1]) / (proxy_rate * seconds) * 1e6
    finally:
        for process in (proxy, upstream):
            process.terminate()
            process.wait(timeout=10)
    ms = 1000.0
    d50, d99 = _quantile(direct_lat, 0.5) * ms, _quantile(direct_lat, 0.99) * ms
    p50, p99 = _quantile(proxy_lat, 0.5) * ms, _quantile(proxy_lat, 0.99) * ms
    print(f"LLM proxy benchmark ({calls} sequential calls each way; {seconds:.0f} s at 32 concurrent clients)")
    print(f"  direct to fake upstream: p50 {d50:.3f} ms  p99 {d99:.3f} ms  {direct_rate:,.0f} calls/s")
    print(f"  through the proxy:       p50 {p50:.3f} ms  p99 {p99:.3f} ms  {proxy_rate:,.0f} calls/s")
    print(f"  added latency:           p50 {p50 - d50:.3f} ms  p99 {p99 - d99:.3f} ms   (target p50 < 1 ms)")
    print(f"  throughput via proxy:    {proxy_rate:,.0f} calls/s at 32 clients   (target >= 1,000 calls/s)")
    load = os.getloadavg()[0]
    print(f"  CPU per call, 32 clients: proxy {proxy_cpu:.0f} us, upstream {upstream_cpu:.0f} us (load {load:.1f})")


if __name__ == "__main__":
    main()
