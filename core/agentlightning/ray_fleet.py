"""Runner fleets on Ray: N runner actors on a Ray cluster, each claiming rollouts from one store server by URL.

``pip install "agentlightning-core[ray]"``. The store runs as a server (``agl store``); every actor runs a
:class:`~agentlightning.runner.Runner` with ``workers_per_runner`` asyncio workers and a
:class:`~agentlightning.client.LightningStoreClient` to that URL, so actors may sit on any machine that reaches it.
The agent is named by import path (``"my_agents:solve"``) and imported inside each actor: install its package on
the cluster's nodes or ship it with ``runtime_env={"working_dir": ...}`` (on a local cluster the driver's
``sys.path`` is passed along). See ``docs/scale.md`` for a multi-machine launch.

    with start_ray_fleet("http://store-host:4747", agent="my_agents:solve", n_runners=32) as fleet:
        fleet.wait()    # until every actor reached max_rollouts, or ^C -> fleet.stop()
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from agentlightning.runner import RunnerStats

logger = logging.getLogger(__name__)

__all__ = ["RayFleet", "start_ray_fleet"]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            'runner fleets on Ray need Ray: pip install "agentlightning-core[ray]" (or "agent-lightning[ray]")'
        ) from exc
    return ray


class _RunnerActor:
    """One runner process on the cluster (wrapped by ``ray.remote`` at start; threaded so ``stop`` can interrupt)."""

    def __init__(
        self,
        store_url: str,
        agent: str,
        worker_id: str,
        workers: int,
        heartbeat_interval_s: float,
        token: str | None,
        sys_path: Sequence[str],
    ) -> None:
        for entry in reversed(sys_path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        from agentlightning.agent import load_agent

        self._store_url = store_url
        self._agent = load_agent(agent)  # fails here, at start, with the import error, not in every rollout
        self._worker_id = worker_id
        self._workers = workers
        self._heartbeat_interval_s = heartbeat_interval_s
        self._token = token
        self._runner: Any = None

    def run(self, max_rollouts: int | None) -> RunnerStats:
        """Claim and run rollouts until ``max_rollouts`` are claimed or :meth:`stop`; returns the runner's stats."""
        import asyncio

        from agentlightning.client import LightningStoreClient
        from agentlightning.runner import Runner

        async def work() -> RunnerStats:
            store = LightningStoreClient(self._store_url, token=self._token)
            self._runner = Runner(
                self._agent,
                store,
                n_workers=self._workers,
                worker_id=self._worker_id,
                heartbeat_interval_s=self._heartbeat_interval_s,
            )
            try:
                return await self._runner.run(max_rollouts=max_rollouts)
            finally:
                await store.close()

        return asyncio.run(work())

    def stop(self) -> None:
        """Ask the runner to stop after its current attempts."""
        if self._runner is not None:
            self._runner.stop()

    def pid(self) -> int:
        """The actor's process id (for logs and fault tests)."""
        return os.getpid()


class RayFleet:
    """Handle on started runner actors: :meth:`wait` for them, :meth:`stop` them, read their :class:`RunnerStats`."""

    def __init__(self, ray: Any, actors: list[Any], runs: list[Any], owns_ray: bool) -> None:
        self._ray = ray
        self.actors = actors
        self._runs = runs
        self._owns_ray = owns_ray
        self._stats: list[RunnerStats] | None = None

    def __len__(self) -> int:
        """Number of runner actors."""
        return len(self.actors)

    def pids(self) -> list[int]:
        """Process ids of the actors (on their nodes)."""
        return [int(pid) for pid in self._ray.get([actor.pid.remote() for actor in self.actors])]

    def wait(self, timeout_s: float | None = None) -> list[RunnerStats]:
        """Wait until every actor's run ends (``max_rollouts`` reached, or stopped); TimeoutError after timeout_s."""
        if self._stats is not None:
            return self._stats
        ready, pending = self._ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout_s)
        if pending:
            raise TimeoutError(
                f"{len(pending)} of {len(self._runs)} runner actors still running after {timeout_s} s; "
                "call stop() to end them"
            )
        self._stats = [self._ray.get(ref) for ref in ready]
        return self._stats

    def stop(self, timeout_s: float = 60.0) -> list[RunnerStats]:
        """Ask every actor to stop after its current attempts, wait up to ``timeout_s``, then kill what is left."""
        if self._stats is None:
            for actor in self.actors:
                actor.stop.remote()
            try:
                self.wait(timeout_s)
            except TimeoutError:
                logger.warning("runner actors did not stop within %.0f s; killing them", timeout_s)
                self._stats = []
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False
        return self._stats or []

    def totals(self) -> RunnerStats:
        """The stats of all actors summed (after :meth:`wait` or :meth:`stop`)."""
        total = RunnerStats()
        for stats in self._stats or []:
            for field in ("claimed", "succeeded", "failed", "timed_out", "lost"):
                setattr(total, field, getattr(total, field) + getattr(stats, field))
        return total

    def __enter__(self) -> RayFleet:
        """Use as a context manager that stops the fleet on exit."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the fleet."""
        self.stop()


def start_ray_fleet(
    store_url: str,
    agent: str,
    n_runners: int,
    *,
    workers_per_runner: int = 4,
    max_rollouts: int | None = None,
    token: str | None = None,
    address: str | None = None,
    num_cpus_per_runner: float = 1.0,
    heartbeat_interval_s: float = 5.0,
    worker_prefix: str | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    ray_init_options: Mapping[str, Any] | None = None,
) -> RayFleet:
    """Start ``n_runners`` runner actors on a Ray cluster, each running ``agent`` against the store at ``store_url``.

    ``address``: the Ray cluster (``"auto"``, ``"ray://head:10001"``; default ``RAY_ADDRESS`` or a local one started
    here and shut down by :meth:`RayFleet.stop`). ``max_rollouts`` is per actor (None: until stopped).
    ``ray_init_options`` go to ``ray.init`` when this call starts Ray (e.g. ``{"num_cpus": 4}``).
    """
    if not store_url.startswith(("http://", "https://")):
        raise ValueError(
            f"store_url must be the URL of a store server (http://host:4747), got {store_url!r}: Ray actors run in "
            "other processes and machines, so they need `agl store` rather than a local file"
        )
    if n_runners < 1 or workers_per_runner < 1:
        raise ValueError(f"n_runners and workers_per_runner must be >= 1; got {n_runners} and {workers_per_runner}")
    if ":" not in agent:
        raise ValueError(f"agent {agent!r} must be an import path 'package.module:function', e.g. 'my_agents:solve'")
    ray = _import_ray()
    owns_ray = not ray.is_initialized()
    if owns_ray:
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        options.update(ray_init_options or {})
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), **options)
    prefix = worker_prefix or f"ray-{int(time.time())}"
    actor_options: dict[str, Any] = {"num_cpus": num_cpus_per_runner, "max_concurrency": 2}
    if runtime_env is not None:
        actor_options["runtime_env"] = dict(runtime_env)
    remote_class = ray.remote(_RunnerActor).options(**actor_options)
    sys_path = [os.getcwd(), *(p for p in sys.path if p and os.path.isdir(p))]
    actors = [
        remote_class.remote(
            store_url, agent, f"{prefix}-r{i}", workers_per_runner, heartbeat_interval_s, token, sys_path
        )
        for i in range(n_runners)
    ]
    runs = [actor.run.remote(max_rollouts) for actor in actors]
    return RayFleet(ray, actors, runs, owns_ray)


def run_fleet_command(
    store_url: str,
    agent: str,
    n_runners: int,
    workers_per_runner: int,
    max_rollouts: int | None,
    token: str | None,
    address: str | None,
) -> int:
    """``agl runner --ray``: run a fleet until every actor is done or ^C; print the totals; return an exit code."""
    try:
        fleet = start_ray_fleet(
            store_url,
            agent,
            n_runners,
            workers_per_runner=workers_per_runner,
            max_rollouts=max_rollouts,
            token=token,
            address=address,
        )
    except (ValueError, ImportError) as exc:
        print(f"agl runner --ray: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"ray fleet: {n_runners} runner actors x {workers_per_runner} workers against {store_url}", flush=True)
    try:
        fleet.wait()
    except KeyboardInterrupt:
        print("stopping the fleet after the current attempts...", flush=True)
    fleet.stop()
    t = fleet.totals()
    print(f"ray fleet done: {t.succeeded} succeeded, {t.failed} failed, {t.timed_out} timed out, {t.lost} not recorded")
    return 0
