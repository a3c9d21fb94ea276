"""Asynchronous LightningRL (issue 28): the staleness bound, whole groups, weight swaps under load, a killed runner,
bad configuration."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from pydantic import ValidationError

from agentlightning.agent import rollout as as_rollout
from agentlightning.runner import Runner
from agentlightning.semconv import HEADER_POLICY_VERSION
from agentlightning.store import InMemoryLightningStore
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.trainer import Trainer
from agentlightning.types import Rollout, RolloutConfig, Transition
from agentlightning_trainer import lightning_rl, tool_choice
from agentlightning_trainer.async_rollouts import RolloutPipeline
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.policy_process import PolicyServerProcess
from agentlightning_trainer.torch_backend.policy import Policy

REPO = Path(__file__).resolve().parents[2]


# --- bad configuration -------------------------------------------------------------------------------------------
def test_negative_staleness_and_async_verl_fail_at_config_time(tool_spec: PolicySpec, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="max_staleness must be >= 0"):
        LightningRLConfig(policy=tool_spec, mode="async", max_staleness=-1)
    with pytest.raises(ValidationError, match="mode='async' is not supported by backend 'verl'"):
        LightningRLConfig(policy=tool_spec, mode="async", backend="verl")
    with pytest.raises(ValidationError, match="mode"):
        LightningRLConfig(policy=tool_spec, mode="overlapped")  # type: ignore[arg-type]  # the wrong value tested
    # Through the algorithm's keyword overrides too: refused before a model is built or a run directory made.
    with pytest.raises(ValidationError, match="max_staleness"):
        LightningRL(run_dir=tmp_path / "run", mode="async", max_staleness=-2)
    assert not (tmp_path / "run").exists()
    assert LightningRLConfig().mode == "sync"  # the synchronous loop stays the default


def test_async_mode_defaults_to_truncated_importance_sampling(tool_spec: PolicySpec, tmp_path: Path) -> None:
    # Measured in bench.learning --async: with tis_cap 2 async needed as many steps as sync, without it ~9% more.
    assert LightningRLConfig(policy=tool_spec, mode="async").tis_cap == 2.0
    assert LightningRLConfig(policy=tool_spec, mode="async", tis_cap=None).tis_cap is None  # turned off on request
    assert LightningRLConfig(policy=tool_spec, mode="async", tis_cap=3.0).tis_cap == 3.0
    assert LightningRLConfig(policy=tool_spec).tis_cap is None  # sync keeps the served logprobs as the ratio's base
    # Keyword overrides on a config follow the mode too, keeping what the config was given.
    base = LightningRLConfig(policy=tool_spec, steps=7)
    algorithm = LightningRL(base, run_dir=tmp_path / "run", mode="async")
    assert algorithm.config.tis_cap == 2.0 and algorithm.config.steps == 7
    assert LightningRL(base, run_dir=tmp_path / "run2", mode="async", tis_cap=None).config.tis_cap is None


# --- the pipeline against a real store and runner, with the served version under the test's control -------------
class _Served:
    """The policy version a fake server answers with, and which version served each rollout."""

    def __init__(self) -> None:
        self.version = 0
        self.by_rollout: dict[str, int] = {}
        self.slowed: set[str] = set()
        self.closing = False


SERVED = _Served()


@as_rollout
async def _versioned(task: dict[str, Any], rollout: Rollout) -> float:
    """Records the version serving it; the first sample of a group of a task with ``hold`` finishes only ``hold``
    versions later (a straggler: its siblings finish at once)."""
    served = SERVED.version
    SERVED.by_rollout[rollout.rollout_id] = served
    if task["hold"] and rollout.group_id not in SERVED.slowed:
        SERVED.slowed.add(rollout.group_id or "")
        while SERVED.version < served + task["hold"] and not SERVED.closing:  # noqa: ASYNC110  # a counter, polled
            await asyncio.sleep(0.01)
    await asyncio.sleep(random.random() * 0.02)
    return float(random.random() < 0.5)


class _VersionAdapter:
    """One transition per rollout, carrying the version that served it (what the proxy records from the header)."""

    def adapt(self, rollout: Rollout, spans: Sequence[Any]) -> list[Transition]:
        return [
            Transition(
                rollout_id=rollout.rollout_id,
                attempt_id="at",
                group_id=rollout.group_id or "",
                turn_index=0,
                span_id="0" * 16,
                prompt_token_ids=[1],
                response_token_ids=[2],
                response_logprobs=[0.0],
                reward=1.0,
                policy_version=SERVED.by_rollout[rollout.rollout_id],
            )
        ]


class _NoProxy:
    url = "http://127.0.0.1:1"

    async def flush(self) -> None:
        return None

    async def stop(self) -> None:
        return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("max_staleness", [0, 1, 2])
async def test_no_sample_older_than_the_bound_reaches_the_learner_and_groups_stay_whole(max_staleness: int) -> None:
    SERVED.__init__()
    store = InMemoryLightningStore()
    snapshot = await store.add_resources({})
    # With a bound of s, a straggler held s + 1 versions is one version too old; with s = 0 nothing overlaps (a
    # straggler would hold the step back, as in the synchronous loop), so there is none.
    tasks = [{"hold": max_staleness + 1 if i == 0 and max_staleness else 0, "i": i} for i in range(6)]
    tasks_per_step, k = 2, 3
    pipeline = RolloutPipeline(
        store, tasks, random.Random(0), adapter=_VersionAdapter(), proxy=_NoProxy(), tasks_per_step=tasks_per_step,
        samples_per_task=k, max_staleness=max_staleness, rollout_config=RolloutConfig(timeout_s=30),
        max_prompt_tokens=None, resources_id=snapshot.resources_id,
    )  # fmt: skip
    runner = Runner(_versioned, store, n_workers=8, poll_interval_s=0.01)
    runner_task = asyncio.create_task(runner.run())
    dropped = 0
    trained: list[str] = []
    try:
        await pipeline.start()
        for _ in range(12):
            taken = await pipeline.next_batch(SERVED.version)
            dropped += taken.stale_groups_dropped
            by_group: dict[str, list[int]] = {}
            for t in taken.batch.transitions:
                by_group.setdefault(t.group_id, []).append(t.policy_version or 0)
                trained.append(t.rollout_id)
            assert len(by_group) == tasks_per_step
            for versions in by_group.values():
                assert len(versions) == k  # whole groups only
                assert SERVED.version - min(versions) <= max_staleness  # never older than the bound
                assert max(versions) - min(versions) <= max_staleness  # never mixed beyond it
            assert set(taken.staleness) <= set(range(max_staleness + 1))
            SERVED.version += 1  # the "update": the served policy moves on
            await pipeline.step_done(SERVED.version)
    finally:
        SERVED.closing = True
        await pipeline.close(10)
        runner.stop()
        await runner_task
    assert len(trained) == len(set(trained))  # each sample reaches the learner at most once
    if max_staleness:
        # Every group with a straggler was dropped whole: neither the straggler nor its fresh siblings were trained.
        assert dropped >= 1
        trained_groups = {r.group_id for r in await store.query_rollouts(rollout_ids=trained)}
        assert SERVED.slowed and not (trained_groups & SERVED.slowed)


# --- weight swaps while requests are in flight ---------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_weight_swaps_during_in_flight_requests_lose_none(tool_spec: PolicySpec, tmp_path: Path) -> None:
    policies = [Policy.build(tool_spec, seed=seed) for seed in range(4)]
    files = []
    for version, policy in enumerate(policies):
        files.append(tmp_path / f"w{version}.pt")
        torch.save(policy.trainable_state_dict(), files[-1])
    tasks = tool_choice.tasks()
    with PolicyServerProcess(tool_spec, files[0], seed=0, log_file=tmp_path / "server.log") as server:

        async def flood() -> list[httpx.Response]:
            first_answered = asyncio.Event()
            async with httpx.AsyncClient(timeout=60) as client:

                async def ask(i: int) -> httpx.Response:
                    await asyncio.sleep(0.004 * i)  # requests keep arriving across the swaps
                    body = {"model": "tiny-gpt", "messages": tool_choice.messages(tasks[i % len(tasks)]),
                            "max_tokens": 6, "logprobs": True, "return_token_ids": True}  # fmt: skip
                    answer = await client.post(server.base_url + "/chat/completions", json=body)
                    first_answered.set()
                    return answer

                async def swap() -> None:
                    # The first swap waits for an answer, so version 0 serves some requests however slow the machine.
                    await first_answered.wait()
                    for version in (1, 2, 3):
                        await asyncio.sleep(0.1)
                        await server.publish(files[version], version)

                swapping = asyncio.create_task(swap())
                answers = await asyncio.gather(*(ask(i) for i in range(150)))
                await swapping
                # and the last version serves the requests that follow the swaps
                return [*answers, *await asyncio.gather(*(ask(i) for i in range(4)))]

        answers = asyncio.run(flood())
    assert [a.status_code for a in answers] == [200] * 154  # no 5xx, none lost
    versions = [int(a.headers[HEADER_POLICY_VERSION]) for a in answers]
    assert {0, 3} <= set(versions) and versions[-4:] == [3] * 4
    # Each answer was generated by one version from its first token to its last: the one its header names.
    for answer, version in zip(answers, versions, strict=True):
        body = answer.json()
        tokens = body["choices"][0]["token_ids"]
        served = [entry["logprob"] for entry in body["choices"][0]["logprobs"]["content"]]
        logprobs, _, _ = policies[version].response_scores([body["prompt_token_ids"]], [tokens])
        assert torch.allclose(logprobs[0, : len(tokens)], torch.tensor(served), atol=1e-4), version


# --- a runner process killed with SIGKILL mid-step -----------------------------------------------------------------
def _spawn_runner(store: Path, worker_id: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "agentlightning.cli", "runner", "--store", str(store)]
    command += ["--agent", "tests.trainer.async_agents:slow_tool_choice", "--workers", "2"]
    command += ["--heartbeat-interval", "0.2", "--worker-id", worker_id, "--quiet"]
    with open(log, "ab") as out:  # a file, not a pipe nobody reads while the runner works
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.timeout(180)
def test_async_training_survives_a_runner_killed_mid_step(
    tool_spec: PolicySpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store.db"
    trained_by_step: list[list[str]] = []
    from agentlightning_trainer.inprocess import with_advantages as original

    def recording(transitions: list[Transition], config: LightningRLConfig) -> Any:
        trained_by_step.append(sorted({t.rollout_id for t in transitions}))
        return original(transitions, config)

    monkeypatch.setattr(lightning_rl, "with_advantages", recording)  # a spy: the real function still runs
    # The trainer runs no runner itself: the first runner process takes the first step's rollouts, is killed with
    # SIGKILL inside one, and a second one started then finishes the run.
    runners = [_spawn_runner(path, "victim", tmp_path / "victim.log")]

    async def kill_when_busy() -> None:
        """SIGKILL the first runner process once it is inside an attempt, then start the rescuer."""
        store = SqliteLightningStore(path)
        try:
            while runners[0].poll() is None:
                for r in await store.query_rollouts(status=["running"]):
                    attempts = await store.query_attempts(r.rollout_id)
                    if any((a.worker_id or "").startswith("victim") and a.status == "running" for a in attempts):
                        os.kill(runners[0].pid, signal.SIGKILL)
                        return
                await asyncio.sleep(0.05)
        finally:
            await store.close()
            # Started even when the first one died on its own, so the run finishes and the assertion says why.
            runners.append(_spawn_runner(path, "rescuer", tmp_path / "rescuer.log"))

    config = LightningRLConfig(
        policy=tool_spec, steps=5, tasks_per_step=2, samples_per_task=2, mode="async", max_staleness=1,
        rollout_heartbeat_timeout_s=2.0, rollout_max_attempts=3, val_every=100,
    )  # fmt: skip
    algorithm = LightningRL(config, run_dir=tmp_path / "run", show_progress=False)
    trainer = Trainer(algorithm, store=path, role="algorithm", watchdog_interval_s=0.2)

    async def main() -> None:
        killer = asyncio.create_task(kill_when_busy())
        await trainer.fit_async(None, tool_choice.tasks())
        killer.cancel()

    try:
        asyncio.run(main())
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.terminate()
            runner.wait(timeout=30)
    assert len(runners) == 2 and runners[0].returncode == -signal.SIGKILL, "the runner was never killed mid-rollout"
    assert [m.step for m in algorithm.history] == [1, 2, 3, 4, 5]

    async def check() -> None:
        store = SqliteLightningStore(path)
        try:
            rollouts = await store.query_rollouts(mode="train")
            victims = 0
            for r in rollouts:
                attempts = await store.query_attempts(r.rollout_id)
                succeeded = [a for a in attempts if a.status == "succeeded"]
                assert r.is_terminal, r
                assert len(succeeded) <= 1, attempts  # never finished twice
                if r.status == "succeeded":
                    assert len(succeeded) == 1
                else:  # only the end of training cancels (queued leftovers)
                    assert r.status == "cancelled", (r.status, attempts)
                victims += sum(
                    1 for a in attempts if (a.worker_id or "").startswith("victim") and a.status != "succeeded"
                )
            assert victims >= 1  # the killed attempt(s) ...
            rescued = [
                r for r in rollouts
                if r.status == "succeeded" and any(
                    (a.worker_id or "").startswith("victim") and a.status == "unresponsive"
                    for a in await store.query_attempts(r.rollout_id)
                )
            ]  # fmt: skip
            assert rescued, "no rollout of the killed runner was retried to success"  # ... were retried and finished
            flat = [rid for step in trained_by_step for rid in step]
            assert len(flat) == len(set(flat))  # each rollout trained exactly once
            by_id = {r.rollout_id: r for r in rollouts}
            assert all(by_id[rid].status == "succeeded" for rid in flat)
        finally:
            await store.close()

    asyncio.run(check())


# --- the trainer process killed with SIGKILL mid-step, then resumed from its checkpoint -------------------------------
def _children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.timeout(240)
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the policy server through Linux /proc")
def test_an_async_run_killed_mid_step_resumes_from_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.trainer._async_trainer_child import config

    path, checkpoints = tmp_path / "store.db", tmp_path / "ckpt"
    runners = [_spawn_runner(path, "first", tmp_path / "runner1.log")]
    command = [sys.executable, "-m", "tests.trainer._async_trainer_child", str(path), str(tmp_path / "run1")]
    with open(tmp_path / "trainer1.log", "ab") as out:
        victim = subprocess.Popen([*command, str(checkpoints), "6"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    async def unfinished() -> list[str]:
        store = SqliteLightningStore(path)
        try:
            return [r.rollout_id for r in await store.query_rollouts(status=["queuing", "requeuing", "running"])]
        finally:
            await store.close()

    async def start_runner_once_cancelled(left: list[str]) -> None:
        """The fleet comes back only after the new trainer has had its chance to cancel what was left."""
        try:
            for _ in range(600):
                if not set(left) & set(await unfinished()):
                    break
                await asyncio.sleep(0.1)
        finally:  # started even if the cancel never came, so the run ends and the assertions say what went wrong
            runners.append(_spawn_runner(path, "second", tmp_path / "runner2.log"))

    trained: list[str] = []
    from agentlightning_trainer.inprocess import with_advantages as original

    def recording(transitions: list[Transition], cfg: LightningRLConfig) -> Any:
        trained.extend(sorted({t.rollout_id for t in transitions}))
        return original(transitions, cfg)

    try:
        while not (checkpoints / "step-000002.pt").exists():  # two steps done, later groups in flight
            assert victim.poll() is None, (tmp_path / "trainer1.log").read_text()[-3000:]
            time.sleep(0.05)
        servers = _children(victim.pid)  # the policy server process
        # The machine goes down: trainer and runners at once, neither cleans up.
        os.kill(victim.pid, signal.SIGKILL)
        os.kill(runners[0].pid, signal.SIGKILL)
        victim.wait(timeout=30)
        assert servers, "the trainer started no policy server process"
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in servers):  # a trainer killed with SIGKILL runs no cleanup of its own
            assert time.monotonic() < deadline, "the killed trainer's policy server kept running"
            time.sleep(0.1)
        latest = max(int(p.stem.split("-")[1]) for p in checkpoints.glob("step-*.pt"))
        left = asyncio.run(unfinished())
        assert left, "the killed trainer left no group in flight"
        monkeypatch.setattr(lightning_rl, "with_advantages", recording)  # a spy: the real function still runs
        algorithm = LightningRL(config(checkpoints, 6), run_dir=tmp_path / "run2", show_progress=False)
        trainer = Trainer(algorithm, store=path, role="algorithm", watchdog_interval_s=0.2)

        async def resume() -> None:
            starter = asyncio.create_task(start_runner_once_cancelled(left))
            await trainer.fit_async(None, tool_choice.tasks())
            await starter

        asyncio.run(resume())
    finally:
        for process in (victim, *runners):
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=30)
    assert [m.step for m in algorithm.history] == list(range(latest + 1, 7))  # from the checkpoint, to the end
    assert algorithm.version == 6

    async def check() -> None:
        store = SqliteLightningStore(path)
        try:
            rollouts = {r.rollout_id: r for r in await store.query_rollouts()}
            assert all(r.is_terminal for r in rollouts.values()), [r for r in rollouts.values() if not r.is_terminal]
            # The killed trainer's groups were cancelled by its successor, and none of them was trained.
            assert {rollouts[rid].status for rid in left} == {"cancelled"}
            assert not set(left) & set(trained)
            assert len(trained) == len(set(trained)) and all(rollouts[r].status == "succeeded" for r in trained)
            for rollout_id in rollouts:
                attempts = await store.query_attempts(rollout_id)
                assert sum(a.status == "succeeded" for a in attempts) <= 1, attempts  # never finished twice
        finally:
            await store.close()

    asyncio.run(check())


# --- the per-step metrics reach the console and TensorBoard --------------------------------------------------------
def test_staleness_and_idle_metrics_on_the_console_and_in_tensorboard(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentlightning_trainer.metrics import MetricsLogger, RunnerUtilisation, StepMetrics

    utilisation = RunnerUtilisation()
    # Two runners busy for the first half of a 10 s step, one of them for the second half too.
    second = 1_000_000_000
    utilisation.observe([
        Rollout(rollout_id=f"r{i}", input={}, enqueue_time=0, start_time=start * second, end_time=end * second)
        for i, (start, end) in enumerate([(0, 5), (0, 10), (1, 5)])
    ])  # fmt: skip
    idle = utilisation.idle_fraction(0, 10 * second)
    assert utilisation.fleet == 3 and idle == pytest.approx(1 - (5 + 10 + 4) / 30)
    out = StringIO()
    record = StepMetrics(
        step=1, reward_mean=0.5, reward_ema=0.5, all_same_frac=0.0, transitions=8, rollouts=8, failed_rollouts=0,
        policy_version=1, policy_lag=0.5, rollout_s=1.0, update_s=1.0, staleness={0: 5, 1: 3},
        stale_groups_dropped=1, stale_rollouts_dropped=4, runner_idle_frac=idle, learner_idle_frac=0.25,
    )  # fmt: skip
    with MetricsLogger(1, log_dir=tmp_path / "tb", console=Console(file=out, force_terminal=False, width=300)) as log:
        log.log(record)
    text = out.getvalue()
    assert "staleness 0:5 1:3" in text and "1 stale group(s) dropped" in text
    assert "runners idle 37%" in text and "learner idle 25%" in text
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"staleness/0", "staleness/1", "stale_groups_dropped", "runner_idle_frac", "learner_idle_frac"} <= scalars
    assert "staleness" in events.Tags()["histograms"]
