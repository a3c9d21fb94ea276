"""The Trainer: wires a store, a watchdog, runners and an algorithm together.

Simple case, one process: ``Trainer(algorithm).fit(agent, train_tasks, val_tasks)`` opens an embedded SQLite store at
``runs/<timestamp>/store.db``, starts a :class:`~agentlightning.store.Watchdog`, ``n_runners`` in-process runner
workers whose spans go to the store, and runs the algorithm; when the algorithm returns the runners stop. With
``runner_processes=N`` it also starts N-1 runner processes on the same store, for agents whose Python work holds the
GIL (:mod:`agentlightning._runner_processes`).

Distributed case: point every process at one store (``store="http://host:4747"`` or a shared SQLite path) and give
each a ``role``: ``"algorithm"`` (no runners), ``"runner"`` (runners only, until stopped) or ``"both"``. The
process running the algorithm also runs a watchdog that times out silent attempts of the whole fleet (a store served
by ``agl store`` runs its own too; ending an attempt is one transaction, so the two never act twice).

``Trainer(llm=LLM(base_url=..., model=...))`` serves that OpenAI-compatible model to the agent: the process that runs
the algorithm puts the LLM proxy in front of it (on loopback, this event loop) and publishes it as resource ``llm``
before the algorithm starts, so every call is recorded as a span of its rollout. An algorithm that serves its own
policy (LightningRL) publishes over it.

``Trainer.dev(agent, tasks)`` runs the loop once with the :class:`BaselineAlgorithm` on an in-memory store and prints,
per rollout, the spans captured, the rewards found and the transitions a trainer would train on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentlightning.algorithm import Algorithm
from agentlightning.runner import Runner, RunnerStats
from agentlightning.store import LightningStore, StoreSpec, open_store

if TYPE_CHECKING:
    from rich.console import Console

    from agentlightning._runner_processes import RunnerProcesses
    from agentlightning.agent import LitAgent
    from agentlightning.proxy import ServedProxy
    from agentlightning.tracing import LightningTracer
    from agentlightning.types import LLM, Transition

# Ids are copied from this table into `agl spans`: never break them across lines.
_ID_COLUMNS = frozenset({"rollout"})
Role = Literal["algorithm", "runner", "both"]
_ROLES: tuple[Role, ...] = ("algorithm", "runner", "both")


@dataclass(frozen=True)
class DevRow:
    """What ``Trainer.dev`` saw for one rollout."""

    rollout_id: str
    status: str
    spans: int
    rewards: int
    final_reward: float | None
    transitions: int
    transitions_with_token_ids: int
    error: str | None


class Trainer:
    """Runs an algorithm against runners of an agent through one store (see the module docstring)."""

    def __init__(
        self,
        algorithm: Algorithm | None = None,
        store: StoreSpec = None,
        n_runners: int = 4,
        *,
        role: Role = "both",
        token: str | None = None,
        run_dir: str | os.PathLike[str] = "runs",
        heartbeat_interval_s: float = 5.0,
        watchdog_interval_s: float = 1.0,
        tracer: LightningTracer | None = None,
        worker_id: str | None = None,
        console: Console | None = None,
        runner_processes: int = 1,
        runner_setup: Sequence[Callable[[], object]] = (),
        llm: LLM | None = None,
    ) -> None:
        """``runner_processes``: processes of this machine that run ``n_runners`` workers each, this one included
        (agents that hold the GIL need more than one to use more than one core); ``runner_setup``: module-level
        callables each extra process runs first, e.g. an integration's ``instrument``; ``llm``: a model to serve the
        agent through the LLM proxy (see the module docstring)."""
        if role not in _ROLES:
            raise ValueError(f"role must be one of {list(_ROLES)}; got {role!r}")
        if llm is not None and role == "runner":
            raise ValueError(
                "llm= is served and published by the process that runs the algorithm (role 'both' or 'algorithm'); "
                "runners read it from the store"
            )
        if n_runners < 1:
            raise ValueError(f"n_runners must be at least 1; got {n_runners}")
        if runner_processes < 1:
            raise ValueError(f"runner_processes must be at least 1; got {runner_processes}")
        self.runner_processes = runner_processes
        self.runner_setup = tuple(runner_setup)
        self.llm = llm
        self.algorithm = algorithm
        self.store_spec = store
        self.n_runners = n_runners
        self.role = role
        self.token = token
        self.run_dir = run_dir
        self.heartbeat_interval_s = heartbeat_interval_s
        self.watchdog_interval_s = watchdog_interval_s
        self.tracer = tracer
        self.worker_id = worker_id
        self.console = console
        self.store: LightningStore | None = None
        self.runner: Runner | None = None
        self.runner_stats: RunnerStats | None = None

    def stop(self) -> None:
        """Stop the runners after their current attempts (ends a ``role="runner"`` fit)."""
        if self.runner is not None:
            self.runner.stop()

    def fit(
        self,
        agent: LitAgent | Callable[..., Any] | None = None,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Run the role(s) to the end on a fresh event loop (see :meth:`fit_async`)."""
        asyncio.run(self.fit_async(agent, train_tasks, val_tasks))

    async def fit_async(
        self,
        agent: LitAgent | Callable[..., Any] | None = None,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Open the store, start the watchdog and runners, run the algorithm; stop everything when it returns."""
        runs_algorithm = self.role in ("algorithm", "both")
        runs_runners = self.role in ("runner", "both")
        if runs_runners and agent is None:
            raise ValueError(f"role {self.role!r} runs the agent: pass it, e.g. trainer.fit(my_agent, train_tasks)")
        algorithm = self.algorithm
        if runs_algorithm and algorithm is None:
            from agentlightning.algorithms import BaselineAlgorithm

            algorithm = BaselineAlgorithm(console=self.console)
        owned = not isinstance(self.store_spec, LightningStore)
        store = self.store = open_store(self.store_spec, token=self.token, run_dir=self.run_dir)
        from agentlightning.store import Watchdog

        # The algorithm's side keeps time for the whole fleet: a local store has no other clock, and beside a store
        # server (which ticks on its own) a second watchdog is harmless. One per training run, not per runner.
        watchdog = Watchdog(store, self.watchdog_interval_s) if runs_algorithm else None
        runner_task: asyncio.Task[RunnerStats] | None = None
        extra: RunnerProcesses | None = None
        guards: list[asyncio.Task[Any]] = []
        proxy: ServedProxy | None = None
        try:
            if watchdog is not None:
                watchdog.start()
            if self.llm is not None and runs_algorithm:
                proxy = await _serve_llm(store, self.llm)
            if runs_runners:
                assert agent is not None  # checked above; narrows for the type checker
                self.runner = Runner(
                    agent,
                    store,
                    n_workers=self.n_runners,
                    worker_id=self.worker_id,
                    heartbeat_interval_s=self.heartbeat_interval_s,
                    tracer=self.tracer,
                )
                if self.runner_processes > 1:  # checks the agent and store can travel before anything starts
                    from agentlightning._runner_processes import RunnerProcesses

                    extra = RunnerProcesses(
                        self.runner_processes - 1,
                        self.runner.agent,
                        store,
                        n_runners=self.n_runners,
                        worker_prefix=self.runner.worker_prefix,
                        heartbeat_interval_s=self.heartbeat_interval_s,
                        token=self.token,
                        setup=self.runner_setup,
                    )
                runner_task = asyncio.create_task(self.runner.run(), name="agl-runner")
                guards.append(runner_task)
                if extra is not None:
                    extra.start()
                    guards.append(asyncio.create_task(extra.watch(), name="agl-runner-processes"))
            if algorithm is not None and runs_algorithm:
                await self._run_algorithm(algorithm, store, train_tasks, val_tasks, guards)
            elif runner_task is not None:
                await asyncio.wait(guards, return_when=asyncio.FIRST_COMPLETED)
                if not runner_task.done() and self.runner is not None:  # a runner process died: stop ours, say why
                    self.runner.stop()
                    await next(guard for guard in guards if guard.done())
                self.runner_stats = await runner_task
        finally:
            if self.runner is not None:
                self.runner.stop()
            for guard in guards[1:]:
                guard.cancel()
            if extra is not None:
                await extra.stop()
            if runner_task is not None and not runner_task.done():
                self.runner_stats = await runner_task
            if proxy is not None:
                await proxy.flush()
                await proxy.stop()
            if watchdog is not None:
                await watchdog.stop()
            if owned:
                await store.close()

    async def _run_algorithm(
        self,
        algorithm: Algorithm,
        store: LightningStore,
        train_tasks: Sequence[Any] | None,
        val_tasks: Sequence[Any] | None,
        guards: Sequence[asyncio.Task[Any]],
    ) -> None:
        algorithm_task = asyncio.create_task(algorithm.run(store, train_tasks, val_tasks), name="agl-algorithm")
        if not guards:
            await algorithm_task
            return
        # If the runners crash, the algorithm would wait forever for rollouts nobody runs: stop it and raise.
        await asyncio.wait({algorithm_task, *guards}, return_when=asyncio.FIRST_COMPLETED)
        if algorithm_task.done():
            algorithm_task.result()
            return
        algorithm_task.cancel()
        stopped = next(guard for guard in guards if guard.done())
        error = stopped.exception()
        raise RuntimeError(f"the runners stopped before the algorithm finished: {error!r}") from error

    # --- dev -----------------------------------------------------------------------------------------------------
    def dev(
        self, agent: LitAgent | Callable[..., Any], tasks: Sequence[Any], *, timeout_s: float | None = None
    ) -> list[DevRow]:
        """Run every task once with the baseline algorithm and print what the trainer would see (rich tables)."""
        return asyncio.run(self.dev_async(agent, tasks, timeout_s=timeout_s))

    async def dev_async(
        self, agent: LitAgent | Callable[..., Any], tasks: Sequence[Any], *, timeout_s: float | None = None
    ) -> list[DevRow]:
        """:meth:`dev` inside a running event loop."""
        from rich.console import Console

        from agentlightning.algorithms import BaselineAlgorithm
        from agentlightning.store import InMemoryLightningStore

        console = self.console or Console()
        algorithm = BaselineAlgorithm(timeout_s=timeout_s, console=console)
        store = self.store_spec if self.store_spec is not None else InMemoryLightningStore()
        dev_trainer = Trainer(
            algorithm,
            open_store(store, token=self.token, run_dir=self.run_dir),
            self.n_runners,
            heartbeat_interval_s=self.heartbeat_interval_s,
            watchdog_interval_s=self.watchdog_interval_s,
            tracer=self.tracer,
            worker_id=self.worker_id,
            console=console,
            llm=self.llm,
        )
        assert isinstance(dev_trainer.store_spec, LightningStore)  # opened above; the dev trainer does not own it
        opened = dev_trainer.store_spec
        try:
            await dev_trainer.fit_async(agent, list(tasks))
            rows = [await _inspect(opened, r.rollout_id) for r in algorithm.rollouts]
        finally:
            if opened is not store:
                await opened.close()
        _print_dev(console, rows)
        return rows


async def _serve_llm(store: LightningStore, llm: LLM) -> ServedProxy:
    """Put the LLM proxy in front of ``llm`` and publish it as resource ``llm`` (other resources carried over)."""
    from agentlightning.proxy import start_proxy

    proxy = await start_proxy(store, llm.base_url, upstream_api_key=llm.api_key)
    try:
        latest = await store.get_resources()
        # The key stays in this process (the proxy sends it upstream): a snapshot is readable by every store client.
        served = llm.model_copy(update={"base_url": proxy.url, "proxied": True, "api_key": None})
        await store.add_resources({**(latest.resources if latest is not None else {}), "llm": served})
    except BaseException:
        await proxy.stop()
        raise
    return proxy


async def _inspect(store: LightningStore, rollout_id: str) -> DevRow:
    from agentlightning.adapter import TraceAdapter
    from agentlightning.emit import final_reward, find_rewards

    rollout = await store.get_rollout(rollout_id)
    spans = await store.query_spans(rollout_id, "latest")
    attempts = await store.query_attempts(rollout_id)
    transitions: list[Transition] = []
    error = attempts[-1].error if attempts else None
    try:
        transitions = TraceAdapter().adapt(rollout, spans)
    except Exception as exc:  # dev shows the adapter's complaint next to the rollout instead of stopping
        error = f"adapter: {type(exc).__name__}: {exc}" if error is None else error
    return DevRow(
        rollout_id=rollout_id,
        status=rollout.status,
        spans=len(spans),
        rewards=len(find_rewards(spans)),
        final_reward=final_reward(spans),
        transitions=len(transitions),
        transitions_with_token_ids=sum(t.has_token_ids for t in transitions),
        error=error,
    )


def _print_dev(console: Console, rows: list[DevRow]) -> None:
    from rich.markup import escape
    from rich.table import Table

    # Five short columns and the errors under the table: at 80 columns an error column got 2 characters and
    # "succeeded" wrapped over three lines.
    table = Table(title="agl dev: what the trainer would see", caption="calls: transitions with token ids / all")
    for column in ("rollout", "status", "spans", "reward", "calls"):
        table.add_column(column, no_wrap=True, justify="left" if column in (*_ID_COLUMNS, "status") else "right")
    for row in rows:
        colour = "green" if row.status == "succeeded" else "red"
        table.add_row(
            row.rollout_id,
            f"[{colour}]{row.status}[/{colour}]",
            str(row.spans),
            "-" if row.final_reward is None else f"{row.final_reward:.4f}",
            f"{row.transitions_with_token_ids}/{row.transitions}",
        )
    console.print(table)
    for row in rows:
        if row.error:  # user and package text: escaped, so "[langchain]" or "[/]" print as written
            console.print(f"[red]{row.rollout_id}[/red]: {escape(row.error)}", soft_wrap=True)
    if rows and not any(row.transitions for row in rows):
        console.print(
            "[yellow]no transitions: no LLM calls with token ids were recorded. Route the agent's LLM through "
            "`agl proxy` (or use an integration) so RL has something to train on.[/yellow]"
        )
