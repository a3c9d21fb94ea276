"""PostgreSQL store benchmark (not a test): full rollout cycles/s, 64 HTTP runner workers, one store server.

Run: ``.venv/bin/python -m bench.store_postgres`` (``--quick`` for a smaller run; ``--dsn`` to use your own
PostgreSQL instead of a throwaway cluster started here). The store server is ``--server-workers`` uvicorn
processes sharing one listening socket (as ``uvicorn --workers`` does), all on one PostgreSQL database. The 64
workers are asyncio tasks spread over ``--client-processes`` processes, each repeating enqueue -> claim and start ->
finish succeeded carrying 10 spans: three requests per rollout, the calls a runner makes (the cycle of
``bench.store_http``); the same cycles run in process (no HTTP) for comparison.
Prints the wall-clock rate and, because the machine is shared, CPU-time-normalised figures: CPU seconds per 1,000
rollouts (= ms per rollout) for the server, PostgreSQL and the clients, the rate one fully used core of server +
PostgreSQL sustains, the cores 1,000 rollouts/s would take in each role, and the load average while measured (a
load above the CPU count means neighbours took CPU, so the wall figure understates what the code does). Target
(issue 16): >= 1,000 rollouts/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.store_http import process_cpu_s

TARGET = 1_000.0
WORKERS = 64
REPO = Path(__file__).resolve().parents[1]

_SERVER = """
import socket, sys, uvicorn
from agentlightning.server import create_app
from agentlightning.store.postgres import PostgresLightningStore
sock = socket.socket(fileno=int(sys.argv[1]))
store = PostgresLightningStore(sys.argv[2], max_connections=int(sys.argv[3]))
config = uvicorn.Config(create_app(store), log_level="warning", access_log=False, lifespan="off", loop="asyncio",
                        http="auto")
uvicorn.Server(config).run(sockets=[sock])
"""

_CLIENT = """
import asyncio, sys, time
from agentlightning.client import LightningStoreClient
from bench.store_http import bench_cycles
url, total, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
async def main():
    client = LightningStoreClient(url)
    try:
        await bench_cycles(client, workers * 2, workers)  # warm up connections and prepared statements
        print("ready", flush=True)
        sys.stdin.readline()  # go
        began, cpu = time.perf_counter(), time.process_time()
        await bench_cycles(client, total, workers)
        print(f"{total // workers * workers} {time.perf_counter() - began} {time.process_time() - cpu}", flush=True)
    finally:
        await client.close()
asyncio.run(main())
"""


@contextlib.contextmanager
def store_servers(dsn: str, workers: int, pool: int) -> Iterator[tuple[str, list[int]]]:
    """``workers`` server processes on one shared loopback socket; yields the URL and their pids."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    sock.set_inheritable(True)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(sock.fileno()), dsn, str(pool)], pass_fds=[sock.fileno()], cwd=REPO
        )
        for _ in range(workers)
    ]
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                raise RuntimeError("store server processes did not start")
            time.sleep(0.1)
        yield url, [c.pid for c in children]
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=30)
        sock.close()


def postgres_cpu_s(postmaster_pid: int | None) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster and its backends (children), living ones only."""
    if postmaster_pid is None:
        return 0.0
    total = process_cpu_s(postmaster_pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster_pid:
                    total += process_cpu_s(int(entry.name))
    return total


def run_clients(url: str, total: int, processes: int) -> tuple[int, float, float]:
    """Start the client processes, release them together; returns (rollouts, wall s, client CPU s while measured)."""
    per = WORKERS // processes
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENT, url, str(total // processes), str(per)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(processes)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    began = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = [child.communicate(timeout=1800)[0].split() for child in children]
    wall = time.perf_counter() - began
    return sum(int(r[0]) for r in results), wall, sum(float(r[2]) for r in results)


def in_process(dsn: str, total: int, postmaster: int | None) -> tuple[int, float, float, float]:
    """The same cycles against PostgresLightningStore in this process: (rollouts, wall s, CPU s, PostgreSQL CPU s)."""
    from agentlightning.store.postgres import PostgresLightningStore
    from bench.store_http import bench_cycles

    async def run() -> tuple[int, float, float, float]:
        store = PostgresLightningStore(dsn, max_connections=WORKERS)
        try:
            await bench_cycles(store, WORKERS * 2, WORKERS)  # warm up the pool and prepared statements
            pg, cpu, began = postgres_cpu_s(postmaster), time.process_time(), time.perf_counter()
            await bench_cycles(store, total, WORKERS)
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            return total // WORKERS * WORKERS, wall, cpu, postgres_cpu_s(postmaster) - pg
        finally:
            await store.close()

    return asyncio.run(run())


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rollouts")
    parser.add_argument("--dsn", help="PostgreSQL DSN to use (default: a throwaway local cluster)")
    parser.add_argument("--server-workers", type=int, default=2, help="store server processes (uvicorn workers)")
    parser.add_argument("--client-processes", type=int, default=2, help="processes the 64 workers are spread over")
    parser.add_argument("--pool", type=int, default=16, help="PostgreSQL connections per server process")
    args = parser.parse_args()
    total = 640 if args.quick else 3_200

    with contextlib.ExitStack() as stack:
        postmaster: int | None = None
        dsn = args.dsn
        if dsn is None:
            from agentlightning.testing.postgres import PostgresCluster

            cluster = stack.enter_context(PostgresCluster())
            dsn = cluster.create_database()
            postmaster = cluster.pid
        url, server_pids = stack.enter_context(store_servers(dsn, args.server_workers, args.pool))
        server_cpu = sum(process_cpu_s(pid) for pid in server_pids)
        pg_cpu = postgres_cpu_s(postmaster)
        load_before = os.getloadavg()[0]
        done, wall, client_cpu = run_clients(url, total, args.client_processes)
        load_after = os.getloadavg()[0]
        server_cpu = sum(process_cpu_s(pid) for pid in server_pids) - server_cpu
        pg_cpu = postgres_cpu_s(postmaster) - pg_cpu

        local_done, local_wall, local_cpu, local_pg = in_process(dsn, total, postmaster)

    rate = done / wall
    per_k = {
        name: cpu / done * 1000 for name, cpu in (("server", server_cpu), ("postgres", pg_cpu), ("clients", client_cpu))
    }
    store_side = server_cpu + pg_cpu
    per_store_core = done / store_side if store_side else float("nan")
    total_cpu = store_side + client_cpu
    print(
        f"PostgreSQL store over HTTP: {WORKERS} runner workers in {args.client_processes} processes -> "
        f"{args.server_workers} server processes -> PostgreSQL; {done} full cycles (5 requests each); "
        f"{os.cpu_count()} CPUs, shared"
    )
    print(
        f"  wall clock            {rate:>9,.0f} rollouts/s   (target {TARGET:,.0f}); load average "
        f"{load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs"
    )
    print(
        f"  CPU s per 1,000       server {per_k['server']:.2f}, postgres {per_k['postgres']:.2f}, "
        f"clients {per_k['clients']:.2f} (total {total_cpu / done * 1000:.2f})"
    )
    print(f"  per store-side core   {per_store_core:>9,.0f} rollouts/s   (server + PostgreSQL CPU only)")
    print(f"  per machine core      {done / total_cpu:>9,.0f} rollouts/s   (every process, clients included)")
    print(
        f"  in-process (no HTTP)  {local_done / local_wall:>9,.0f} rollouts/s wall, "
        f"{local_done / (local_cpu + local_pg):,.0f} per core of this process + PostgreSQL "
        f"(CPU s per 1,000: store {local_cpu / local_done * 1000:.2f}, postgres {local_pg / local_done * 1000:.2f})"
    )
    need = {name: per_k[name] * TARGET / 1000 for name in per_k}
    print(
        f"  cores for {TARGET:,.0f}/s      server {need['server']:.1f}, postgres {need['postgres']:.1f}, "
        f"clients {need['clients']:.1f} (total {sum(need.values()):.1f}; CPU time only, no headroom)"
    )
    cores = TARGET / per_store_core if per_store_core else float("nan")
    verdict = "ok" if rate >= TARGET else f"BELOW on this machine; {cores:.1f} idle store-side cores would reach it"
    print(f"  verdict: {verdict}")


if __name__ == "__main__":
    main()
