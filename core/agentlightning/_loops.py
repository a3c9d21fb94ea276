"""Closing the event loops agentlightning creates for itself (sink threads, the sync facade, the proxy thread).

A loop closed with tasks still pending leaves coroutines that run their ``finally`` blocks when garbage-collected,
into a closed loop: psycopg's pool workers, for one, then raise "Event loop is closed" as unraisable exceptions,
and their connections stay open until then. ``asyncio.run`` avoids that by cancelling the tasks and closing async
generators first; :func:`close_loop` does the same for loops that are not run through it.
"""

from __future__ import annotations

import asyncio
import logging
import threading

__all__ = ["close_loop", "run_forever_then_close"]

log = logging.getLogger(__name__)
CANCEL_WAIT_S = 5.0  # a task that ignores its cancellation must not hang the close


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel ``loop``'s pending tasks, let them finish, close its async generators, then close it.

    ``loop`` must be stopped; a closed loop is left as it is. Called from a thread that runs a loop of its own
    (asyncio forbids running a second one there), the work moves to a short-lived thread.
    """
    if loop.is_closed():
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        helper = threading.Thread(target=close_loop, args=(loop,), name="agentlightning-close-loop")
        helper.start()
        helper.join()
        return
    try:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = loop.run_until_complete(asyncio.wait(tasks, timeout=CANCEL_WAIT_S))
            if stuck:
                log.warning("%d task(s) ignored cancellation while their event loop closed: %s", len(stuck), stuck)
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def run_forever_then_close(loop: asyncio.AbstractEventLoop) -> None:
    """A loop thread's target: run ``loop`` until ``loop.stop()``, then :func:`close_loop` it on the same thread."""
    try:
        loop.run_forever()
    finally:
        close_loop(loop)
