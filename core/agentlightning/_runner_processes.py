"""More runner processes for one Trainer: ``Trainer(runner_processes=N)`` (the Trainer's process is the first).

An agent that spends its time in Python (a CrewAI kickoff, a LangGraph graph) holds the GIL, so every runner worker
of one process shares one core however many workers there are. The extra processes are started with
multiprocessing's "spawn" (nothing inherited but what is passed: no forked locks or threads), each runs
``n_runners`` workers against the same store, and stops after its current attempts when the Trainer's algorithm is
done — or on its own when the Trainer's process is gone. The agent travels as ``"module:attribute"`` when it can be
imported by that name (a ``@rollout`` function, a module-level instance), else pickled; ``setup`` callables (an
integration's ``instrument``) run first in each process, because instrumentation is per process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.synchronize import Event

from agentlightning.agent import FunctionAgent, LitAgent, import_attribute, load_agent
from agentlightning.store.base import LightningStore

# How often the Trainer looks for a runner process that died, and how long stop() waits for them to finish their
# attempts before terminating them.
WATCH_S = 0.5
STOP_TIMEOUT_S = 60.0


def _resolve(module_name: str, qualname: str) -> object | None:
    """What ``module_name``'s ``qualname`` is after importing the module (None when missing)."""
    try:
        return import_attribute(f"{module_name}:{qualname}", "runner process object")
    except ValueError:
        return None


def _importable_name(obj: object, module_name: str | None = None, qualname: str | None = None) -> str | None:
    """``"module:qualname"`` (by default ``obj``'s own) that imports back to ``obj`` in a fresh process, else None.

    ``__main__`` counts when it is a script file: a "spawn" child imports the script again (as ``__main__``, without
    running its ``if __name__ == "__main__":`` block), so its functions are there; an interactive session's are not.
    """
    module_name = module_name or getattr(obj, "__module__", None)
    qualname = qualname or getattr(obj, "__qualname__", None)
    if not module_name or not qualname or "<" in qualname:
        return None
    if module_name == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None):
        return None
    return f"{module_name}:{qualname}" if _resolve(module_name, qualname) is obj else None


def agent_reference(agent: LitAgent) -> str | None:
    """``"module:name"`` that :func:`load_agent` turns back into ``agent`` (a ``@rollout`` function: its name)."""
    if isinstance(agent, FunctionAgent):
        # ``@rollout`` replaces the module's function by the agent: the function's name now names the agent.
        function = agent.function
        return _importable_name(agent, getattr(function, "__module__", None), getattr(function, "__qualname__", None))
    return _importable_name(agent)


def store_reference(store: LightningStore) -> str:
    """What another process opens to reach ``store``: its SQLite file or its server's URL."""
    from agentlightning.client import LightningStoreClient
    from agentlightning.store.sqlite import SqliteLightningStore

    if isinstance(store, SqliteLightningStore) and store.path != ":memory:":
        return os.path.abspath(store.path)
    if isinstance(store, LightningStoreClient):
        return store.url
    raise ValueError(
        f"runner_processes > 1 needs a store that other processes can open, a SQLite file or a store server URL; "
        f"got {type(store).__name__} (an in-memory store lives in one process)"
    )


class StopFlag:
    """Set when the Trainer asks the runners to stop, or when the Trainer's process is gone (no orphans)."""

    def __init__(self, event: Event, parent_pid: int) -> None:
        self._event = event
        self._parent_pid = parent_pid

    def is_set(self) -> bool:
        """True once the runner should stop claiming."""
        return self._event.is_set() or os.getppid() != self._parent_pid


def _run_child(
    agent: str | bytes,
    store: str,
    token: str | None,
    n_runners: int,
    worker_id: str,
    heartbeat_interval_s: float,
    setup: Sequence[Callable[[], object]],
    stop: Event,
    parent_pid: int,
) -> None:
    """A runner process: run ``setup``, then ``n_runners`` workers until the stop event (or the parent's death)."""
    from agentlightning.runner import Runner
    from agentlightning.store import open_store

    # ^C at a terminal reaches the whole process group: the Trainer's process handles it and stops this one through
    # the event, after its current attempts, instead of each process dying mid-attempt with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for step in setup:
        step()
    lit_agent: LitAgent = load_agent(agent) if isinstance(agent, str) else pickle.loads(agent)

    async def run() -> None:
        opened = open_store(store, token=token)
        try:
            runner = Runner(
                lit_agent, opened, n_workers=n_runners, worker_id=worker_id, heartbeat_interval_s=heartbeat_interval_s
            )
            await runner.run(stop_event=StopFlag(stop, parent_pid))
        finally:
            await opened.close()

    asyncio.run(run())


class RunnerProcesses:
    """``count`` runner processes of one agent against one store, started, watched and stopped by the Trainer."""

    def __init__(
        self,
        count: int,
        agent: LitAgent,
        store: LightningStore,
        *,
        n_runners: int,
        worker_prefix: str,
        heartbeat_interval_s: float,
        token: str | None = None,
        setup: Sequence[Callable[[], object]] = (),
    ) -> None:
        agent_sent: str | bytes | None = agent_reference(agent)
        if agent_sent is None:
            try:
                agent_sent = pickle.dumps(agent)
            except Exception as exc:
                raise ValueError(
                    f"runner_processes > 1 sends the agent to other processes, but {agent!r} can neither be imported "
                    f"by name (define it at the top level of a module or of the script) nor pickled: {exc}"
                ) from exc
        for step in setup:
            if _importable_name(step) is None:
                raise ValueError(f"setup callables must be importable module-level functions; got {step!r}")
        store_spec = store_reference(store)
        token = token or getattr(store, "token", None)  # a client passed in carries its own
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._processes = [
            context.Process(
                target=_run_child,
                args=(
                    agent_sent,
                    store_spec,
                    token,
                    n_runners,
                    f"{worker_prefix}-p{i + 1}",
                    heartbeat_interval_s,
                    tuple(setup),
                    self._stop,
                    os.getpid(),
                ),
                name=f"agl-runner-p{i + 1}",
                daemon=True,
            )
            for i in range(count)
        ]

    def start(self) -> None:
        """Start every process."""
        for process in self._processes:
            process.start()

    async def watch(self) -> None:
        """Return only if a runner process exits before :meth:`stop`, raising with its exit code."""
        while True:
            for process in self._processes:
                if process.exitcode is not None and not self._stop.is_set():
                    raise RuntimeError(f"runner process {process.name} exited with code {process.exitcode}")
            await asyncio.sleep(WATCH_S)

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every process to stop after its current attempts; terminate those still running after ``timeout_s``."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for process in self._processes:
            if process.pid is None:
                continue
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.terminate()
                await asyncio.to_thread(process.join, 5.0)
