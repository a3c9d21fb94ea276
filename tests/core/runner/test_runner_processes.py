"""Trainer(runner_processes=N): extra runner processes (spawned) share the store's queue with the Trainer's own."""

from __future__ import annotations

import asyncio
import contextlib
import io
import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest
from rich.console import Console

from agentlightning._runner_processes import StopFlag, agent_reference, store_reference
from agentlightning.agent import rollout
from agentlightning.algorithms import BaselineAlgorithm
from agentlightning.store import InMemoryLightningStore
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.trainer import Trainer
from tests.core.runner import agents
from tests.core.runner.agents import Misbehaving, counting, fail_setup, mark_setup, reporting


def _trainer(store: Any, processes: int, setup: tuple[Any, ...] = ()) -> Trainer:
    console = Console(file=io.StringIO(), width=200)
    algorithm = BaselineAlgorithm(console=console)
    return Trainer(
        algorithm, store=store, n_runners=2, console=console, runner_processes=processes, runner_setup=setup,
        heartbeat_interval_s=0.5,
    )  # fmt: skip


def test_rollouts_run_in_the_trainers_process_and_the_extra_one_which_ran_its_setup(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    trainer = _trainer(str(db), processes=2, setup=(mark_setup,))
    # 2 workers a process, 0.25 s a rollout: the Trainer's process alone would need 10 s for 80, so the extra
    # process (up in ~1-2 s) takes a share.
    trainer.fit(reporting, [{"i": i, "sleep": 0.25} for i in range(80)])
    assert trainer.algorithm is not None

    async def read() -> tuple[list[str], list[tuple[str, str]]]:
        store = SqliteLightningStore(db)
        try:
            rollouts = await store.query_rollouts()
            workers: list[tuple[str, str]] = []
            for r in rollouts:
                (attempt,) = await store.query_attempts(r.rollout_id)
                spans = await store.query_spans(r.rollout_id, "latest")
                said = next(
                    str(s.attributes.get("agentlightning.message.body", ""))
                    for s in spans
                    if "pid=" in str(s.attributes)
                )
                workers.append((attempt.worker_id or "", said))
            return [r.status for r in rollouts], workers
        finally:
            await store.close()

    statuses, workers = asyncio.run(read())
    assert statuses == ["succeeded"] * 80
    extra = [said for worker, said in workers if re.search(r"-p1-w\d+$", worker)]
    own = [said for worker, said in workers if not re.search(r"-p1-w\d+$", worker)]
    assert extra and own, workers
    # the extra process ran the setup step and is another process; the Trainer's own process did not run it
    assert all(f"pid={os.getpid()} " not in said and said.endswith("setup=True") for said in extra)
    assert all(said == f"pid={os.getpid()} setup=False" for said in own)


def test_a_runner_process_that_dies_stops_the_fit_with_its_exit_code(tmp_path: Path) -> None:
    trainer = _trainer(str(tmp_path / "store.db"), processes=2, setup=(fail_setup,))
    with pytest.raises(RuntimeError, match=r"runner process agl-runner-p1 exited with code 1"):
        # enough slow work that the fit is still running when the extra process fails in its setup
        trainer.fit(reporting, [{"i": i, "sleep": 0.5} for i in range(200)])


def test_an_in_memory_store_cannot_be_shared_and_nothing_starts() -> None:
    trainer = _trainer(InMemoryLightningStore(), processes=2)
    with pytest.raises(ValueError, match=r"a SQLite file or a store server URL; got InMemoryLightningStore"):
        trainer.fit(counting, [{"i": 1}])


def test_an_agent_another_process_cannot_get_is_refused(tmp_path: Path) -> None:
    local = rollout(lambda task: 1.0)  # neither importable by name nor picklable
    with pytest.raises(ValueError, match=r"can neither be imported by name .* nor pickled"):
        _trainer(str(tmp_path / "store.db"), processes=2).fit(local, [{"i": 1}])
    with pytest.raises(ValueError, match="setup callables must be importable module-level functions"):
        _trainer(str(tmp_path / "store.db"), processes=2, setup=(lambda: None,)).fit(counting, [{"i": 1}])
    with pytest.raises(ValueError, match="runner_processes must be at least 1; got 0"):
        Trainer(runner_processes=0)


def test_agent_references_name_the_module_attribute() -> None:
    assert agent_reference(counting) == "tests.core.runner.agents:counting"
    assert agent_reference(Misbehaving()) is None  # an instance made here: it travels pickled
    assert agents.SETUP_RAN is False  # setup steps run in the extra processes only


def test_store_reference_is_the_file_or_the_url(tmp_path: Path) -> None:
    from agentlightning.client import LightningStoreClient

    async def refs() -> tuple[str, str]:
        store = SqliteLightningStore(tmp_path / "s.db")
        client = LightningStoreClient("http://127.0.0.1:4747/")
        try:
            return store_reference(store), store_reference(client)
        finally:
            await store.close()
            await client.close()

    assert asyncio.run(refs()) == (str(tmp_path / "s.db"), "http://127.0.0.1:4747")


def test_the_stop_flag_is_set_by_the_event_or_when_the_parent_is_gone() -> None:
    event = multiprocessing.get_context("spawn").Event()
    assert not StopFlag(event, os.getppid()).is_set()
    assert StopFlag(event, -1).is_set()  # the process that started us is not our parent any more
    event.set()
    assert StopFlag(event, os.getppid()).is_set()


_INTERRUPTED_FIT = """
import signal
import sys
from agentlightning.algorithms import BaselineAlgorithm
from agentlightning.trainer import Trainer
from tests.core.runner.agents import dump_stacks_on_sigusr1, reporting

if __name__ == "__main__":
    # A terminal's command gets ^C; one started from a non-interactive shell's background job (`nohup make test &`)
    # inherits SIGINT ignored, and Python then keeps ignoring it: the fit never saw the ^C (a clean-clone run).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    dump_stacks_on_sigusr1()
    trainer = Trainer(
        BaselineAlgorithm(), store=sys.argv[1], n_runners=2, runner_processes=2, runner_setup=[dump_stacks_on_sigusr1]
    )
    # Far more work than the test waits for: on a loaded machine the second process took long enough to start
    # that 400 rollouts had all finished before the ^C was sent (a CI run).
    trainer.fit(reporting, [{"i": i, "sleep": 0.5} for i in range(4000)])
"""


def _fail_with_stacks(group: int, log: Path, why: str) -> NoReturn:
    """Fail with the threads' and asyncio tasks' stacks every process of ``group`` writes to ``log`` on SIGUSR1
    (``agents.dump_stacks_on_sigusr1``: how the inherited ignored SIGINT above was found), then kill the group."""
    os.killpg(group, signal.SIGUSR1)
    time.sleep(2)
    os.killpg(group, signal.SIGKILL)
    raise AssertionError(f"{why}:\n{log.read_text()}")


def test_ctrl_c_stops_the_trainer_and_its_runner_processes(tmp_path: Path) -> None:
    """^C reaches the whole process group: the fit stops, and no runner process is left behind."""
    script = tmp_path / "fit.py"
    script.write_text(_INTERRUPTED_FIT)
    repo = Path(__file__).resolve().parents[3]
    log = tmp_path / "fit.log"
    # Output to a file, not a pipe: nothing blocks on a full pipe, and a hang's stack dump can be read back.
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "store.db")],
            cwd=repo,
            env={**os.environ, "PYTHONPATH": str(repo)},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal gives a command
        )
    try:
        deadline = time.monotonic() + 60
        while _attempt_workers(tmp_path / "store.db") < 2:  # both processes are running rollouts
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _fail_with_stacks(process.pid, log, "the fit did not stop within 60 s of ^C")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    deadline = time.monotonic() + 15
    while True:  # the group is empty once the runner process has finished its attempts and exited
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            _fail_with_stacks(process.pid, log, "a process outlived the interrupted fit by 15 s")
        time.sleep(0.2)
    output = log.read_text()
    assert "KeyboardInterrupt" in output
    # the Trainer's process reports the interrupt; its runner process stopped without a traceback of its own
    assert "_run_child" not in output and "multiprocessing" not in output, output


def _succeeded_workers(db: Path) -> list[str]:
    """The worker id of every succeeded attempt in the store at ``db``."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [row[0] for row in conn.execute("SELECT worker_id FROM attempts WHERE status = 'succeeded'")]


def _attempt_workers(db: Path) -> int:
    """How many runner processes have started attempts in the store at ``db`` (0 before it exists)."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        try:
            rows = conn.execute("SELECT DISTINCT worker_id FROM attempts").fetchall()
        except sqlite3.OperationalError:  # the tables are not there yet
            return 0
    return len({re.sub(r"-w\d+$", "", row[0]) for row in rows if row[0]})


def test_agl_train_runs_runner_processes_with_their_setup(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"i": {i}, "sleep": 0.25}}\n' for i in range(60)))
    db = tmp_path / "store.db"
    repo = Path(__file__).resolve().parents[3]
    command = [sys.executable, "-m", "agentlightning.cli", "train", "--agent", "tests.core.runner.agents:reporting"]
    command += ["--tasks", str(tasks), "--store", str(db), "--runners", "2", "--runner-processes", "2"]
    command += ["--runner-setup", "tests.core.runner.agents:mark_setup"]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _attempt_workers(db) == 2
    workers = _succeeded_workers(db)
    assert len(workers) == 60 and any(re.search(r"-p1-w\d+$", w) for w in workers)


def test_agl_train_refuses_a_setup_step_it_cannot_call() -> None:
    from typer.testing import CliRunner

    from agentlightning.cli import app

    args = ["train", "--agent", "tests.core.runner.agents:reporting", "--role", "runner", "--runner-processes", "2"]
    for spec, said in (("no_colon", "must look like"), ("tests.core.runner.agents:SETUP_RAN", "is not callable")):
        result = CliRunner().invoke(app, [*args, "--runner-setup", spec], env={"COLUMNS": "200"})
        assert result.exit_code != 0 and said in result.output, result.output


def test_runner_processes_share_a_store_server_over_http(tmp_path: Path) -> None:
    from agentlightning.client import LightningStoreClient
    from agentlightning.server import StoreServer

    token = "runner-processes-test-token"
    with StoreServer(lambda: SqliteLightningStore(tmp_path / "served.db"), token=token) as server:
        served = LightningStoreClient(server.url, token=token)  # the runner process borrows the client's token
        _trainer(served, processes=2, setup=(mark_setup,)).fit(reporting, [{"i": i, "sleep": 0.25} for i in range(60)])
        asyncio.run(served.close())  # the Trainer closes only the stores it opened

        async def workers() -> list[str]:
            client = LightningStoreClient(server.url, token=token)
            try:
                found: list[str] = []
                for r in await client.query_rollouts():
                    found += [a.worker_id or "" for a in await client.query_attempts(r.rollout_id)]
                return found
            finally:
                await client.close()

        seen = asyncio.run(workers())
    assert len(seen) == 60 and any(re.search(r"-p1-w\d+$", w) for w in seen)


_SCRIPT_AGENT_FIT = """
import sys
from agentlightning import rollout
from agentlightning.algorithms import BaselineAlgorithm
from agentlightning.emit import emit_message
from agentlightning.trainer import Trainer


@rollout
def script_agent(task):
    import time

    time.sleep(task["sleep"])
    emit_message("from the script")
    return 1.0


if __name__ == "__main__":
    trainer = Trainer(BaselineAlgorithm(), store=sys.argv[1], n_runners=2, runner_processes=2)
    trainer.fit(script_agent, [{"i": i, "sleep": 0.25} for i in range(40)])
"""


def test_an_agent_defined_in_the_training_script_reaches_the_runner_processes(tmp_path: Path) -> None:
    """The usual single-file script: ``@rollout`` in ``__main__``, the fit under the ``__main__`` guard."""
    script = tmp_path / "train_here.py"
    script.write_text(_SCRIPT_AGENT_FIT)
    db = tmp_path / "store.db"
    # a relative store path: the runner process opens the same file
    done = subprocess.run(
        [sys.executable, str(script), "store.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = _succeeded_workers(db)
    assert len(workers) == 40 and any(re.search(r"-p1-w\d+$", w) for w in workers)


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (Linux /proc)."""
    found: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc/<pid>/cmdline (Linux)")
def test_agl_runner_processes_get_the_token_from_the_environment_not_argv(tmp_path: Path) -> None:
    """`agl runner --processes N --token T` used to pass T on each child's command line, readable by every user."""
    from agentlightning.client import LightningStoreClient
    from agentlightning.server import StoreServer
    from agentlightning.types import RolloutRequest

    token = "argv-must-not-hold-this-token"
    with StoreServer(lambda: SqliteLightningStore(tmp_path / "served.db"), token=token) as server:

        async def enqueue(n: int) -> list[str]:
            client = LightningStoreClient(server.url, token=token)
            try:
                requests = [RolloutRequest(input={"i": i, "sleep": 0.2}) for i in range(n)]
                rollouts = await client.enqueue_rollouts(requests)
                return [r.rollout_id for r in rollouts]
            finally:
                await client.close()

        ids = asyncio.run(enqueue(8))
        agent = "tests.core.runner.agents:reporting"
        command = [sys.executable, "-m", "agentlightning.cli", "runner", "--store", server.url, "--agent", agent,
                   "--processes", "2", "--max-rollouts", "4", "--quiet"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "AGENTLIGHTNING_TOKEN"}
        parent = subprocess.Popen([*command, "--token", token], env=env)
        try:
            deadline = time.monotonic() + 60
            children: list[int] = []
            while len(children) < 2 and time.monotonic() < deadline and parent.poll() is None:
                children = _children(parent.pid)
                time.sleep(0.05)
            assert len(children) == 2, "the two runner processes did not start"
            for child in children:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                assert token.encode() not in b" ".join(argv), argv
            assert parent.wait(timeout=120) == 0  # the children authenticated: each ran its 4 rollouts
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()

        async def statuses() -> list[str]:
            client = LightningStoreClient(server.url, token=token)
            try:
                return [r.status for r in await client.query_rollouts()]
            finally:
                await client.close()

        assert sorted(asyncio.run(statuses())) == ["succeeded"] * len(ids)
