"""The runner: claims rollouts from a store, runs the agent on each, and records how every attempt ended.

One :class:`Runner` drives ``n_workers`` asyncio tasks against one :class:`LightningStore` (local, or a
:class:`~agentlightning.client.LightningStoreClient`). Per claimed rollout a worker fetches the resources snapshot the
attempt names (else the latest), runs the agent inside :func:`rollout_context` with the rollout's ``timeout_s``
while heartbeating, emits the returned reward as a reward span, flushes the tracer, and only then finishes the
attempt together with its last spans — so an algorithm that sees a rollout succeed reads all of its spans. Claims
start the attempt in the same call (``claim_and_start``); against a remote store the attempt's spans are held and
sent with its heartbeats and its finish (:mod:`agentlightning._held_spans`): two requests per short rollout.
Sync agents run on reused daemon threads (:mod:`agentlightning._agent_threads`), so they neither block the loop nor
keep a stopped process alive when they hang. Agent errors fail the attempt (``"<ExceptionType>: <message>"``) and
the worker moves on.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentlightning._agent_threads import call_in_thread
from agentlightning._held_spans import HeldSpanSink
from agentlightning.agent import LitAgent, as_agent, normalize_reward
from agentlightning.extras import flush_loaded_integrations
from agentlightning.store.base import LightningStore, StoreError
from agentlightning.types import Attempt, AttemptStatus, ClaimedRollout, ResourcesSnapshot, Rollout, Span

if TYPE_CHECKING:
    from agentlightning.tracing import LightningTracer

logger = logging.getLogger(__name__)

# Longest error text stored on an attempt; tracebacks stay in the logs.
_MAX_ERROR_CHARS = 2000


class _Flag(Protocol):
    def is_set(self) -> bool: ...


@dataclass
class RunnerStats:
    """How the attempts of one :meth:`Runner.run` ended, as this runner saw them."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    lost: int = 0  # finish refused or unreachable: the watchdog (or a cancel) ended the attempt first

    @property
    def finished(self) -> int:
        """Attempts this runner ran to an end (any outcome)."""
        return self.succeeded + self.failed + self.timed_out + self.lost


@dataclass(frozen=True)
class AttemptOutcome:
    """What a worker recorded for one attempt (given to ``on_attempt`` callbacks, e.g. progress bars)."""

    rollout_id: str
    attempt_id: str
    worker_id: str
    status: AttemptStatus
    error: str | None
    recorded: bool


def describe_exception(exc: BaseException) -> str:
    """``"<Type>: <message>"`` as stored on a failed attempt."""
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def default_worker_prefix() -> str:
    """``<host>-<pid>``: unique per process on a machine, readable in ``agl rollouts``."""
    return f"{socket.gethostname()}-{os.getpid()}"


async def _ended(task: asyncio.Task[None]) -> None:
    """Wait until a cancelled task has run its cleanup (``asyncio.wait`` does not raise the task's outcome)."""
    await asyncio.wait([task])


class _IdleWorkers:
    """The runner's idle workers: the one polling the store holds ``gate``; the others sleep until told that work
    was found (FIFO, so the longest idle goes first)."""

    def __init__(self) -> None:
        self.gate = asyncio.Lock()
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    async def sleep(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for :meth:`wake`; True when woken."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(woken)
        try:
            # asyncio.wait, not a timeout: it never cancels the future, so a wake landing with the timeout counts.
            await asyncio.wait([woken], timeout=timeout_s)
        finally:
            if not woken.done():
                self._waiting.remove(woken)
                woken.cancel()
        return not woken.cancelled()

    def wake(self, n: int) -> None:
        """Wake up to ``n`` sleepers."""
        while n > 0 and self._waiting:
            woken = self._waiting.popleft()
            if not woken.done():
                woken.set_result(None)
                n -= 1


# Process-wide tracers installed by runners: id(tracer) -> (the store it writes to, runners using it, its sink when
# that holds the spans of running attempts).
_shared_lock = threading.Lock()
_shared_tracers: dict[int, tuple[LightningStore, int, HeldSpanSink | None]] = {}


class _Flusher:
    """Coalesces the flushes of many workers into rounds of one blocking ``tracer.flush`` on a thread.

    A worker's spans are enqueued before it asks, and a round starts only after every worker waiting on it asked,
    so each round covers all of them. ``tracer.flush`` blocks, and the sink may need the event loop to store spans,
    hence the thread; one thread per round rather than per worker keeps 32 workers from filling the executor.
    """

    def __init__(self, tracer: LightningTracer, timeout_s: float) -> None:
        self._tracer = tracer
        self._timeout_s = timeout_s
        self._next: asyncio.Future[bool] | None = None
        self._pumping = False
        self._pump_task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references to tasks

    async def flush(self) -> bool:
        """Wait until every span finished before the call is delivered; False if some were lost or it timed out."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        round_ = self._next
        if not self._pumping:
            self._pumping = True
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        return await asyncio.shield(round_)

    def _flush_all(self) -> bool:
        # Integrations first: a framework that delivers events on its own threads creates spans when flushed.
        flush_loaded_integrations(self._timeout_s)
        return self._tracer.flush(self._timeout_s)

    async def _pump(self) -> None:
        try:
            while self._next is not None:
                round_, self._next = self._next, None
                try:
                    ok = bool(await asyncio.to_thread(self._flush_all))
                except Exception:  # a broken sink must not stop the runner; the tracer counts its own drops
                    logger.warning("tracer flush failed; some spans may be missing from the store", exc_info=True)
                    ok = False
                round_.set_result(ok)
        finally:
            self._pumping = False


class Runner:
    """Claims rollouts from ``store`` with ``n_workers`` concurrent workers and runs ``agent`` on each."""

    def __init__(
        self,
        agent: LitAgent | Callable[..., Any],
        store: LightningStore,
        *,
        n_workers: int = 1,
        worker_id: str | None = None,
        heartbeat_interval_s: float = 10.0,
        tracer: LightningTracer | None = None,
        poll_interval_s: float = 0.5,
        flush_timeout_s: float = 10.0,
        on_attempt: Callable[[AttemptOutcome], None] | None = None,
        max_store_outage_s: float | None = None,
    ) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be at least 1; got {n_workers}")
        if heartbeat_interval_s <= 0:
            raise ValueError(f"heartbeat_interval_s must be positive; got {heartbeat_interval_s}")
        if max_store_outage_s is not None and max_store_outage_s <= 0:
            raise ValueError(
                f"max_store_outage_s must be positive seconds or None (retry forever); got {max_store_outage_s}"
            )
        self.agent = as_agent(agent)
        self.store = store
        self.n_workers = n_workers
        self.worker_prefix = worker_id or default_worker_prefix()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.poll_interval_s = poll_interval_s
        self.flush_timeout_s = flush_timeout_s
        self.on_attempt = on_attempt
        self.max_store_outage_s = max_store_outage_s
        self.stats = RunnerStats()
        # Why the runner stopped on its own: the store stayed unreachable past max_store_outage_s (None: it did not).
        self.gave_up: str | None = None
        self._store_down_since: float | None = None  # monotonic time of the first failed claim of this outage
        self._tracer = tracer
        self._owned_tracer: LightningTracer | None = None
        self._flusher: _Flusher | None = None
        self._held: HeldSpanSink | None = None
        self._stop = threading.Event()  # threading, not asyncio: stop() may come from a signal handler or thread
        self._resources: dict[str, ResourcesSnapshot] = {}
        self._budget: int | None = None
        self._idle: _IdleWorkers | None = None  # set by run()

    # --- lifecycle -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the workers to stop after their current attempt (safe from any thread)."""
        self._stop.set()

    async def run(self, max_rollouts: int | None = None, stop_event: _Flag | None = None) -> RunnerStats:
        """Work until ``max_rollouts`` are claimed, :meth:`stop` is called or ``stop_event`` is set; returns stats."""
        if max_rollouts is not None and max_rollouts < 0:
            raise ValueError(f"max_rollouts must be >= 0 or None; got {max_rollouts}")
        self._stop.clear()
        self.gave_up = None
        self._budget = max_rollouts
        self._idle = _IdleWorkers()
        self._flusher = _Flusher(self._start_tracing(), self.flush_timeout_s)
        workers = [
            asyncio.create_task(self._work(f"{self.worker_prefix}-w{i}", stop_event), name=f"agl-worker-{i}")
            for i in range(self.n_workers)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await self._flusher.flush()
            await self._stop_tracing()
        return self.stats

    def run_sync(self, max_rollouts: int | None = None, stop_event: _Flag | None = None) -> RunnerStats:
        """:meth:`run` on a fresh event loop, for scripts and runner processes."""
        return asyncio.run(self.run(max_rollouts, stop_event))

    # --- tracing -------------------------------------------------------------------------------------------------
    def _start_tracing(self) -> LightningTracer:
        """The tracer whose spans reach this store: the one given, else the process-wide one, writing to the store.

        Emit helpers and integrations write through the process-wide tracer, so runners of one store in one process
        share it (counted; the last one out shuts it down). A local store (memory, SQLite) is thread-safe, so the
        sink stores spans on the exporter thread's own loop: a SQLite commit (fsync) on the runner's loop would stall
        every worker (bench/runner.py: 60 -> 400 rollouts/s). Any other store (the HTTP client) is awaited on the
        runner's loop, where its connection pool lives and is closed with it, and its sink holds the spans of
        running attempts so that they reach the store with the attempt's heartbeats and finish (fewer requests).
        """
        if self._tracer is not None:
            return self._tracer
        from agentlightning.store import InMemoryLightningStore
        from agentlightning.store.sqlite import SqliteLightningStore
        from agentlightning.tracing import StoreSpanSink, get_lightning_tracer, init_tracing

        with _shared_lock:
            current = get_lightning_tracer()
            shared = _shared_tracers.get(id(current)) if current is not None else None
            if current is not None and shared is not None and shared[0] is self.store:
                _shared_tracers[id(current)] = (self.store, shared[1] + 1, shared[2])
                self._held = shared[2]
            else:
                if isinstance(self.store, InMemoryLightningStore | SqliteLightningStore):
                    self._held = None
                    current = init_tracing(StoreSpanSink(self.store))
                else:
                    self._held = HeldSpanSink(StoreSpanSink(self.store, loop=asyncio.get_running_loop()))
                    current = init_tracing(self._held)
                _shared_tracers[id(current)] = (self.store, 1, self._held)
        self._owned_tracer = current
        return current

    async def _stop_tracing(self) -> None:
        tracer, self._owned_tracer = self._owned_tracer, None
        if tracer is None:
            return
        from agentlightning.tracing import get_lightning_tracer, shutdown_tracing

        self._held = None
        with _shared_lock:
            store, users, held = _shared_tracers.pop(id(tracer), (self.store, 1, None))
            if users > 1:
                _shared_tracers[id(tracer)] = (store, users - 1, held)
                return
        # In a thread: shutting down drains the queue through the sink, which may block on the store.
        if get_lightning_tracer() is tracer:
            await asyncio.to_thread(shutdown_tracing, self.flush_timeout_s)
        else:
            await asyncio.to_thread(tracer.shutdown, self.flush_timeout_s)

    # --- workers -------------------------------------------------------------------------------------------------
    def _stopping(self, stop_event: _Flag | None) -> bool:
        return self._stop.is_set() or (stop_event is not None and stop_event.is_set())

    def _take_budget(self) -> bool:
        if self._budget is None:
            return True
        if self._budget <= 0:
            return False
        self._budget -= 1
        return True

    def _return_budget(self) -> None:
        if self._budget is not None:
            self._budget += 1

    async def _work(self, worker_id: str, stop_event: _Flag | None) -> None:
        failures = 0
        while not self._stopping(stop_event):
            if not self._take_budget():
                return
            try:
                claimed = await self._claim(worker_id, stop_event)
            except Exception as exc:  # store down or restarting: back off, keep the worker alive
                self._return_budget()
                failures += 1
                logger.debug("worker %s: claim failed (%d in a row)", worker_id, failures, exc_info=True)
                self._claim_failed(exc)
                await asyncio.sleep(min(5.0, 0.1 * 2**failures))
                continue
            failures = 0
            self._claim_succeeded()
            if claimed is None:
                self._return_budget()
                continue
            await self.run_attempt(claimed, worker_id)

    def _claim_failed(self, exc: Exception) -> None:
        """One log line when the store becomes unreachable (not one traceback per worker per try); give up past
        ``max_store_outage_s``."""
        now = time.monotonic()
        if self._store_down_since is None:
            self._store_down_since = now
            limit = "" if self.max_store_outage_s is None else f" for up to {self.max_store_outage_s:g} s"
            logger.warning("store unreachable, retrying%s: %s", limit, describe_exception(exc))
        elif self.max_store_outage_s is not None and now - self._store_down_since > self.max_store_outage_s:
            if self.gave_up is None:
                self.gave_up = (
                    f"store unreachable for {now - self._store_down_since:.0f} s "
                    f"(max_store_outage_s={self.max_store_outage_s:g}): {describe_exception(exc)}"
                )
                logger.error("runner stopping: %s", self.gave_up)
            self._stop.set()

    def _claim_succeeded(self) -> None:
        if self._store_down_since is not None:
            logger.warning("store reachable again after %.1f s", time.monotonic() - self._store_down_since)
            self._store_down_since = None

    async def _claim(self, worker_id: str, stop_event: _Flag | None) -> ClaimedRollout | None:
        """Claim one rollout: at once if one is waiting, else wait for one (:meth:`_claim_when_idle`)."""
        claimed = await self.store.claim_and_start(worker_id)
        if self._idle is None:
            return claimed
        if claimed is None:
            claimed = await self._claim_when_idle(self._idle, worker_id, stop_event)
        if claimed is not None:
            # Work was queued, so more may be: two sleeping workers try at once, and each that claims wakes two
            # more. A burst of N rollouts is claimed in ~log2(N) rounds of concurrent claims, which a local store
            # commits together, instead of one claim at a time; when the queue runs dry, each claimed rollout costs
            # at most two claims that find nothing.
            self._idle.wake(2)
        return claimed

    async def _claim_when_idle(
        self, idle: _IdleWorkers, worker_id: str, stop_event: _Flag | None
    ) -> ClaimedRollout | None:
        """One idle worker polls the store; the others sleep until a claim succeeds somewhere (or a poll interval
        passes, so a free gate finds a new poller and a stop is seen).

        Idle workers do not all poll because every waiting claim polls (a local store re-checks on every change
        and every 20 ms): 48 idle workers each polling cost thousands of queries a second on the event loop, while
        the learner updates in the same process (bench/learning.py).
        """
        while not self._stopping(stop_event):
            if not idle.gate.locked():
                async with idle.gate:
                    if self._stopping(stop_event):
                        return None
                    return await self.store.claim_and_start(worker_id, timeout_s=self.poll_interval_s)
            if await idle.sleep(self.poll_interval_s):
                return await self.store.claim_and_start(worker_id)
        return None

    async def run_attempt(self, claimed: ClaimedRollout, worker_id: str) -> AttemptOutcome:
        """Run one claimed attempt (started already, or still preparing) to its end and record the outcome."""
        rollout, attempt = claimed.rollout, claimed.attempt
        self.stats.claimed += 1
        try:
            resources = await self._resources_for(rollout, attempt)
            if attempt.status == "preparing":
                attempt = await self.store.start_attempt(rollout.rollout_id, attempt.attempt_id)
        except Exception as exc:
            return await self._finish(rollout, attempt, worker_id, "failed", describe_exception(exc))
        if self._held is not None:
            self._held.hold(rollout.rollout_id, attempt.attempt_id)
        try:
            return await self._run_started(rollout, attempt, resources, worker_id)
        finally:
            if self._held is not None:  # normally released by _finish; only an abandoned attempt leaves spans here
                left = self._held.release(rollout.rollout_id, attempt.attempt_id)
                if left:
                    logger.warning("dropped %d spans of abandoned attempt %s", len(left), attempt.attempt_id)

    async def _run_started(
        self, rollout: Rollout, attempt: Attempt, resources: ResourcesSnapshot | None, worker_id: str
    ) -> AttemptOutcome:
        from agentlightning.tracing import rollout_context

        status: AttemptStatus = "succeeded"
        error: str | None = None
        interval = self.heartbeat_interval_s
        if rollout.config.heartbeat_timeout_s is not None:
            # Beat at least three times per heartbeat timeout, so a slow default never makes a live attempt look dead.
            interval = min(interval, rollout.config.heartbeat_timeout_s / 3)
        heartbeat = asyncio.create_task(self._heartbeat(rollout.rollout_id, attempt.attempt_id, interval))
        try:
            with rollout_context(rollout.rollout_id, attempt.attempt_id):
                try:
                    returned = await asyncio.wait_for(
                        self._call_agent(rollout, attempt, resources), rollout.config.timeout_s
                    )
                    self._emit_reward(returned)
                except TimeoutError:
                    status = "timeout"
                    error = (
                        f"TimeoutError: agent {self.agent.name!r} ran past the attempt timeout of "
                        f"{rollout.config.timeout_s} s (RolloutConfig.timeout_s)"
                    )
                except Exception as exc:
                    status, error = "failed", describe_exception(exc)
                    logger.info("rollout %s attempt %s failed: %s", rollout.rollout_id, attempt.attempt_id, error)
                    self._emit_exception(exc)
        except asyncio.CancelledError:
            # The runner itself is being torn down mid-attempt: say so now rather than leave the attempt to the
            # watchdog, then let the cancellation continue.
            error = "RunnerStopped: the runner was cancelled while the agent was running"
            await asyncio.shield(self._finish(rollout, attempt, worker_id, "failed", error, heartbeat))
            raise
        finally:
            heartbeat.cancel()
        await _ended(heartbeat)  # it may hold spans it took: they must be back before the finish takes them all
        if self._flusher is not None and not await self._flusher.flush():
            logger.warning(
                "spans of rollout %s may be incomplete: the tracer lost some or timed out", rollout.rollout_id
            )
        return await self._finish(rollout, attempt, worker_id, status, error)

    async def _call_agent(self, rollout: Rollout, attempt: Attempt, resources: ResourcesSnapshot | None) -> Any:
        args, kwargs = self.agent.bind(rollout, attempt, resources)
        function = self.agent.entrypoint()
        if self.agent.is_async:
            return await function(*args, **kwargs)
        result = await call_in_thread(function, args, kwargs)
        if inspect.isawaitable(result):  # a sync callable that returns a coroutine (e.g. a partial of async def)
            return await result
        return result

    def _emit_reward(self, returned: Any) -> None:
        reward = normalize_reward(returned)
        if reward is None:
            return
        from agentlightning.emit import emit_reward

        if isinstance(returned, int | float):
            emit_reward(reward.value)
        else:
            emit_reward(reward.dimensions, primary=reward.primary)

    def _emit_exception(self, exc: BaseException) -> None:
        try:
            from agentlightning.emit import emit_exception

            emit_exception(exc)
        except Exception:  # recording the error is best effort; the attempt's error field has it already
            logger.debug("could not emit the exception span", exc_info=True)

    async def _resources_for(self, rollout: Rollout, attempt: Attempt) -> ResourcesSnapshot | None:
        resources_id = attempt.resources_id or rollout.resources_id
        if resources_id is None:  # the store found no snapshot at claim time: the agent runs without resources
            return None
        if resources_id in self._resources:
            return self._resources[resources_id]  # snapshots are immutable: cache forever
        snapshot = await self.store.get_resources(resources_id)
        if snapshot is not None:
            self._resources[snapshot.resources_id] = snapshot
        return snapshot

    async def _heartbeat(self, rollout_id: str, attempt_id: str, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            # Held spans go out instead of a bare heartbeat (a span is one); undelivered ones go back for the next.
            held = self._held.take(rollout_id, attempt_id) if self._held is not None else []
            try:
                if held:
                    await self.store.add_spans(held)
                else:
                    await self.store.heartbeat(rollout_id, attempt_id)
            except StoreError as exc:  # the attempt is no longer live (watchdog, cancel): nothing to keep alive
                self._put_back(rollout_id, attempt_id, held)
                logger.warning("heartbeat for %s/%s refused, stopping heartbeats: %s", rollout_id, attempt_id, exc)
                return
            except BaseException as exc:  # transient (connection): the next beat may get through; or cancelled
                self._put_back(rollout_id, attempt_id, held)
                if not isinstance(exc, Exception):
                    raise
                logger.debug("heartbeat for %s/%s failed", rollout_id, attempt_id, exc_info=True)

    def _put_back(self, rollout_id: str, attempt_id: str, spans: list[Span]) -> None:
        if spans and self._held is not None:
            self._held.put_back(rollout_id, attempt_id, spans)

    async def _finish(
        self,
        rollout: Rollout,
        attempt: Attempt,
        worker_id: str,
        status: AttemptStatus,
        error: str | None,
        heartbeat: asyncio.Task[None] | None = None,
    ) -> AttemptOutcome:
        if heartbeat is not None:
            heartbeat.cancel()
            await _ended(heartbeat)
        recorded = True
        held = self._held.release(rollout.rollout_id, attempt.attempt_id) if self._held is not None else []
        try:
            await self.store.finish_attempt_with_spans(
                rollout.rollout_id, attempt.attempt_id, status, held, error=error
            )
        except Exception as exc:  # the watchdog timed it out first, or the store is unreachable: count, go on
            recorded = False
            logger.warning(
                "could not record %s for rollout %s attempt %s: %s",
                status,
                rollout.rollout_id,
                attempt.attempt_id,
                describe_exception(exc),
            )
        if not recorded:
            self.stats.lost += 1
        elif status == "succeeded":
            self.stats.succeeded += 1
        elif status == "timeout":
            self.stats.timed_out += 1
        else:
            self.stats.failed += 1
        outcome = AttemptOutcome(rollout.rollout_id, attempt.attempt_id, worker_id, status, error, recorded)
        if self.on_attempt is not None:
            try:
                self.on_attempt(outcome)
            except Exception:  # a progress-bar callback must not kill a worker
                logger.debug("on_attempt callback failed", exc_info=True)
        return outcome
