"""The runner's pool of daemon threads for sync agents: reuse, growth past a hung job, idle exit, context, errors."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import threading
import time

import pytest

from agentlightning._agent_threads import DaemonThreads, call_in_thread

_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def _wait_until(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_sequential_jobs_reuse_one_thread() -> None:
    pool = DaemonThreads(idle_s=5.0)
    seen: list[int] = []
    for _ in range(20):
        done = threading.Event()
        pool.submit(lambda done=done: (seen.append(threading.get_ident()), done.set()))
        assert done.wait(5.0)
        _wait_until(lambda: pool._idle == 1)  # pyright: ignore[reportPrivateUsage]  # back in the pool before the next
    assert len(set(seen)) == 1
    assert pool.threads == 1


def test_concurrent_jobs_get_a_thread_each_and_a_hung_job_holds_up_nothing() -> None:
    pool = DaemonThreads(idle_s=5.0)
    release = threading.Event()
    started = threading.Barrier(9, timeout=5.0)
    for _ in range(8):
        pool.submit(lambda: (started.wait(), release.wait(10.0)))
    started.wait()  # all 8 run at once: none waited for another's thread
    assert pool.threads == 8
    later = threading.Event()
    pool.submit(later.set)  # the 8 are still blocked: a 9th thread takes it
    assert later.wait(5.0)
    assert pool.threads == 9
    release.set()


def test_idle_threads_exit_and_the_pool_grows_again() -> None:
    pool = DaemonThreads(idle_s=0.2)
    barrier = threading.Barrier(5, timeout=5.0)
    for _ in range(4):
        pool.submit(lambda: barrier.wait())
    barrier.wait()
    assert pool.threads == 4
    _wait_until(lambda: pool.threads == 0)
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(5.0)


def test_many_submits_racing_idle_timeouts_run_every_job() -> None:
    # idle_s this short makes threads time out while submits count on them: no job may be stranded.
    pool = DaemonThreads(idle_s=0.001)
    ran = 0
    lock = threading.Lock()

    def job() -> None:
        nonlocal ran
        with lock:
            ran += 1

    for i in range(2000):
        pool.submit(job)
        if i % 50 == 0:
            time.sleep(0.002)
    _wait_until(lambda: ran == 2000)


def test_a_raising_job_keeps_its_thread_usable(caplog: pytest.LogCaptureFixture) -> None:
    pool = DaemonThreads(idle_s=5.0)

    def boom() -> None:
        raise RuntimeError("job bug")

    pool.submit(boom)
    done = threading.Event()
    _wait_until(lambda: pool._idle == 1)  # pyright: ignore[reportPrivateUsage]
    pool.submit(done.set)
    assert done.wait(5.0)
    assert pool.threads == 1
    assert "agent thread job raised" in caplog.text


def test_bad_idle_s_is_refused() -> None:
    with pytest.raises(ValueError, match="idle_s must be positive"):
        DaemonThreads(idle_s=0)


async def test_call_in_thread_carries_the_context_and_the_outcome() -> None:
    _who.set("rollout-7")

    def agent(x: int, *, y: int) -> tuple[str, int, bool]:
        return _who.get(), x + y, threading.current_thread() is threading.main_thread()

    assert await call_in_thread(agent, [1], {"y": 2}) == ("rollout-7", 3, False)

    def failing() -> None:
        raise ValueError("agent error")

    with pytest.raises(ValueError, match="agent error"):
        await call_in_thread(failing, [], {})


async def test_a_timed_out_call_leaves_the_loop_free() -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call_in_thread(time.sleep, [1.0], {}), 0.05)
    assert await call_in_thread(lambda: 5, [], {}) == 5  # another thread serves the next call meanwhile


def test_a_hung_agent_does_not_keep_the_process_alive() -> None:
    script = (
        "import asyncio, time\n"
        "from agentlightning._agent_threads import call_in_thread\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.wait_for(call_in_thread(time.sleep, [3600], {}), 0.1)\n"
        "    except TimeoutError:\n"
        "        print('timed out', flush=True)\n"
        "asyncio.run(main())\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timed out"
    assert time.monotonic() - started < 30


def test_a_thread_that_cannot_start_queues_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = DaemonThreads(idle_s=5.0)
    ran: list[str] = []

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            pool.submit(lambda: ran.append("refused"))
    assert pool.threads == 0
    done = threading.Event()
    pool.submit(lambda: (ran.append("second"), done.set()))
    assert done.wait(5.0)
    time.sleep(0.1)
    assert ran == ["second"]  # the refused job was never queued, so no later thread ran it


async def test_call_in_thread_gives_what_asyncio_to_thread_gives() -> None:
    # The library's way (asyncio.to_thread: the caller's context, the value or the exception) is the reference; the
    # pool differs only in that its threads are daemons, reused.
    _who.set("rollout-9")

    def agent(x: int) -> tuple[str, int]:
        if x < 0:
            raise KeyError(x)
        return _who.get(), x * 2

    for x in (3, 0):
        assert await call_in_thread(agent, [x], {}) == await asyncio.to_thread(agent, x)
    errors: list[BaseException] = []
    for call in (call_in_thread(agent, [-1], {}), asyncio.to_thread(agent, -1)):
        with pytest.raises(KeyError) as caught:
            await call
        errors.append(caught.value)
    assert [type(e) for e in errors] == [KeyError, KeyError] and errors[0].args == errors[1].args
