"""Agents the runner tests run, in process and in `agl runner` subprocesses (``tests.core.runner.agents:NAME``)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from agentlightning.agent import LitAgent, rollout
from agentlightning.emit import emit_message
from agentlightning.types import Attempt

# Spans a `counting` rollout records: two messages plus the reward span of its return value.
COUNTING_SPANS = 3


@rollout
async def counting(task: dict[str, Any]) -> float:
    """Emit two messages and return the task's reward (after ``task["sleep"]`` seconds, if given)."""
    emit_message(f"start {task['i']}")
    await asyncio.sleep(task.get("sleep", 0))
    emit_message(f"end {task['i']}")
    return float(task["i"] % 7)


@rollout
def counting_sync(task: dict[str, Any]) -> float:
    """The sync twin of :func:`counting` (runs on a thread)."""
    emit_message(f"start {task['i']}")
    emit_message(f"end {task['i']}")
    return float(task["i"] % 7)


@rollout
def hang_first_attempt(task: Any, attempt: Attempt) -> float:
    """Hang (as if stuck) on the first attempt; succeed on a retry."""
    emit_message(f"attempt {attempt.sequence_id}")
    if attempt.sequence_id == 1:
        time.sleep(3600)
    return 1.0


class Misbehaving(LitAgent):
    """Does what the task says: raise, hang, return garbage, or succeed."""

    async def rollout(self, task: dict[str, Any], /) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Act out ``task["do"]``."""
        action = task["do"]
        if action == "raise":
            raise KeyError("no such tool: calculator")
        if action == "hang":
            await asyncio.sleep(3600)
        if action == "string":
            return "42"
        if action == "nan":
            return float("nan")
        return {"accuracy": 1.0, "brevity": 0.5, "primary": "brevity"}


@rollout
def sleepy_sync(task: dict[str, Any]) -> float:
    """A sync agent that sleeps ``task["sleep"]`` seconds (past its timeout, in the tests)."""
    time.sleep(task["sleep"])
    return 1.0


# Set by `mark_setup` in the processes that ran it (Trainer(runner_setup=...) runs it in each extra runner process).
SETUP_RAN = False


def mark_setup() -> None:
    """A runner process's setup step (as an integration's ``instrument`` would be)."""
    global SETUP_RAN
    SETUP_RAN = True


def fail_setup() -> None:
    """A setup step that fails, so its runner process exits."""
    raise RuntimeError("this setup step fails on purpose")


def dump_stacks_on_sigusr1() -> None:
    """Runner setup (and a step of the fit script's main): SIGUSR1 prints every thread's stack and every asyncio task's
    stack of the main thread's running loop, so a hang is legible."""
    import faulthandler
    import signal
    import sys

    def print_tasks(signum: int, frame: object) -> None:
        try:
            tasks = asyncio.all_tasks(asyncio.get_running_loop())
        except RuntimeError:  # no loop running on the main thread
            return
        for task in tasks:
            print(f"asyncio task {task.get_name()}:", file=sys.stderr)
            task.print_stack(file=sys.stderr)

    signal.signal(signal.SIGUSR1, print_tasks)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)


@rollout
async def reporting(task: dict[str, Any]) -> float:
    """Say which process ran the rollout and whether its setup ran, after ``task["sleep"]`` seconds."""
    emit_message(f"pid={os.getpid()} setup={SETUP_RAN}")
    await asyncio.sleep(task.get("sleep", 0))
    return 1.0
