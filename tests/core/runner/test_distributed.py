"""Runner processes (`agl runner`) against one store over HTTP: sharing the queue, and surviving a kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.runner import Runner
from agentlightning.server import StoreServer
from agentlightning.store import InMemoryLightningStore, Watchdog
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.types import RolloutRequest
from tests.core.runner.agents import hang_first_attempt
from tests.core.runner.test_runner import assert_each_finished_once

REPO = Path(__file__).resolve().parents[3]


def spawn_runner(url: str, agent: str, worker_id: str, workers: int = 4, processes: int = 1) -> subprocess.Popen[bytes]:
    """`agl runner` in a fresh interpreter, importing the test agents from the repository root."""
    command = [sys.executable, "-m", "agentlightning.cli", "runner", "--store", url]
    command += ["--agent", f"tests.core.runner.agents:{agent}", "--workers", str(workers)]
    command += ["--processes", str(processes), "--heartbeat-interval", "0.2", "--worker-id", worker_id, "--quiet"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:  # only the runners this test started
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)  # reaps it and closes its pipe


async def test_200_rollouts_across_2_runner_processes_over_http(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    with StoreServer(lambda: SqliteLightningStore(tmp_path / "store.db", synchronous="NORMAL")) as server:
        client = LightningStoreClient(server.url)
        try:
            # Each rollout takes 0.2 s, so one process alone would need 5 s: the other is up long before that.
            requests = [RolloutRequest(input={"i": i, "sleep": 0.2}) for i in range(200)]
            rollouts = await client.enqueue_rollouts(requests)
            # One `agl runner --processes 2`: the parent starts two runner processes and forwards SIGTERM to them.
            parent = spawn_runner(server.url, "counting", "fleet", workers=8, processes=2)
            processes.append(parent)
            done = await client.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=60)
            assert len(done) == 200
            parent.send_signal(signal.SIGTERM)
            out, _ = parent.communicate(timeout=20)
            assert parent.returncode == 0, out.decode()
            await assert_each_finished_once(client, 200)
            attempts = [a for r in rollouts for a in await client.query_attempts(r.rollout_id)]
            assert {(a.worker_id or "").rsplit("-", 1)[0] for a in attempts} == {"fleet-p0", "fleet-p1"}
        finally:
            await client.close()


async def test_killed_runner_attempt_times_out_and_another_runner_finishes_it(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    with StoreServer(InMemoryLightningStore()) as server:
        client = LightningStoreClient(server.url)
        try:
            rollout = await client.enqueue_rollout({"task": "x"}, heartbeat_timeout_s=1.0, max_attempts=2)
            victim = spawn_runner(server.url, "hang_first_attempt", "victim", workers=1)
            processes.append(victim)
            deadline = time.monotonic() + 30
            while not await client.query_spans(rollout.rollout_id, "latest"):  # it is inside the agent
                assert time.monotonic() < deadline, "the runner process never started the attempt"
                assert victim.poll() is None, victim.communicate()[0].decode()
                await asyncio.sleep(0.05)
            os.kill(victim.pid, signal.SIGKILL)
            victim.communicate(timeout=10)

            async with Watchdog(client, interval_s=0.2):
                rescuer = Runner(hang_first_attempt, client, worker_id="rescuer", poll_interval_s=0.2)
                stats = await rescuer.run(max_rollouts=1)
            assert stats.succeeded == 1
            final = await client.get_rollout(rollout.rollout_id)
            assert final.status == "succeeded"
            attempts = await client.query_attempts(rollout.rollout_id)
            assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
            assert attempts[0].worker_id == "victim-w0" and attempts[1].worker_id == "rescuer-w0"
        finally:
            await client.close()


def test_sigterm_after_the_last_rollout_does_not_kill_the_runner_mid_exit(tmp_path: Path) -> None:
    # A supervisor's SIGTERM can land after `--max-rollouts` ended the run, while the store closes; the process
    # must still exit 0. SIGTERM is sent every millisecond from the rollout's success until the process is gone.
    path = tmp_path / "store.db"

    async def enqueue() -> str:
        store = SqliteLightningStore(path)
        try:
            return (await store.enqueue_rollout({"i": 0})).rollout_id
        finally:
            await store.close()

    async def succeeded(rollout_id: str) -> bool:
        store = SqliteLightningStore(path)
        try:
            rollout = await store.get_rollout(rollout_id)
            return rollout is not None and rollout.status == "succeeded"
        finally:
            await store.close()

    rollout_id = asyncio.run(enqueue())
    command = [sys.executable, "-m", "agentlightning.cli", "runner", "--store", str(path), "--max-rollouts", "1"]
    command += ["--agent", "tests.core.runner.agents:counting", "--workers", "1", "--quiet"]
    runner = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not asyncio.run(succeeded(rollout_id)):
            assert runner.poll() is None, runner.communicate()[0].decode()
            assert time.monotonic() < deadline, "the runner never finished the rollout"
            time.sleep(0.01)
        signals = 0
        while runner.poll() is None:
            runner.send_signal(signal.SIGTERM)
            signals += 1
            time.sleep(0.001)
        assert runner.returncode == 0, (signals, runner.communicate()[0].decode())
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate(timeout=10)
