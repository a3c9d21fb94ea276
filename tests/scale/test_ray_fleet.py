"""Runner fleets on a local Ray cluster: two runner actors share one store server's queue over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning.client import LightningStoreClient
from agentlightning.server import StoreServer
from agentlightning.store import SqliteLightningStore
from agentlightning.types import RolloutRequest

pytest.importorskip("ray", reason='needs Ray: pip install "agentlightning-core[ray]"')

from agentlightning.ray_fleet import start_ray_fleet

ROLLOUTS = 24
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
async def test_two_ray_runner_actors_finish_every_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with StoreServer(lambda: SqliteLightningStore(tmp_path / "store.db")) as server:
        client = LightningStoreClient(server.url)
        try:
            rollouts = await client.enqueue_rollouts([RolloutRequest(input={"i": i}) for i in range(ROLLOUTS)])
            # max_rollouts per actor: each actor must take half, so both demonstrably ran.
            fleet = start_ray_fleet(
                server.url,
                "tests.scale.agents:quick",
                n_runners=2,
                workers_per_runner=2,
                max_rollouts=ROLLOUTS // 2,
                num_cpus_per_runner=0.5,
                worker_prefix="rayfleet",
                ray_init_options={"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024},
            )
            with fleet:
                assert len(fleet) == 2
                pids = fleet.pids()
                assert len(set(pids)) == 2 and os.getpid() not in pids  # two separate actor processes
                stats = fleet.wait(timeout_s=180)
            assert [s.succeeded for s in stats] == [ROLLOUTS // 2, ROLLOUTS // 2]
            assert fleet.totals().failed == 0 and fleet.totals().lost == 0
            done = await client.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=10)
            assert {r.status for r in done} == {"succeeded"} and len(done) == ROLLOUTS
            workers = {a.worker_id for r in rollouts for a in await client.query_attempts(r.rollout_id)}
            assert {(w or "").rsplit("-", 1)[0] for w in workers} == {"rayfleet-r0", "rayfleet-r1"}
        finally:
            await client.close()


def test_fleet_needs_a_store_url() -> None:
    with pytest.raises(ValueError, match="URL of a store server"):
        start_ray_fleet("runs/store.db", "tests.scale.agents:quick", n_runners=1)
    with pytest.raises(ValueError, match="import path"):
        start_ray_fleet("http://127.0.0.1:1", "quick", n_runners=1)


def test_agl_runner_ray_refuses_a_file_store() -> None:
    # `agl runner --ray` hands over to run_fleet_command -> start_ray_fleet (whose run is tested above).
    command = [sys.executable, "-m", "agentlightning.cli", "runner", "--ray", "--store", "runs/x.db"]
    result = subprocess.run([*command, "--agent", "m:f"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "URL of a store server" in result.stderr
