"""``agl runner``: runner workers against a store, in one process, several, or on a Ray cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from agentlightning.runner import RunnerStats

from agentlightning.cli._common import (
    TOKEN_ENV,
    StoreOption,
    TokenOption,
    app,
    make_console,
)


# --- runners ---------------------------------------------------------------------------------------------------------
@app.command("runner")
def runner_command(
    store: StoreOption,
    agent: Annotated[str, typer.Option(help="The agent to run, as module:function (or module:LitAgentClass).")],
    workers: Annotated[int, typer.Option(min=1, help="Concurrent workers (asyncio tasks) per process.")] = 4,
    processes: Annotated[int, typer.Option(min=1, help="Runner processes to start on this machine.")] = 1,
    max_rollouts: Annotated[
        int | None, typer.Option(help="Stop after claiming this many rollouts (per process); default: run until ^C.")
    ] = None,
    heartbeat_interval: Annotated[float, typer.Option(help="Seconds between heartbeats of a running attempt.")] = 5.0,
    worker_id: Annotated[str | None, typer.Option(help="Prefix of worker ids; default <host>-<pid>.")] = None,
    token: TokenOption = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    ray: Annotated[
        bool, typer.Option("--ray", help="Run --processes runner actors on a Ray cluster (--store must be a URL).")
    ] = False,
    ray_address: Annotated[
        str | None, typer.Option(envvar="RAY_ADDRESS", help="Ray cluster address with --ray; default: a local one.")
    ] = None,
    max_store_outage: Annotated[
        float,
        typer.Option(
            "--max-store-outage",
            metavar="SECONDS",
            min=0,
            help="Stop with exit code 1 when the store has been unreachable this long (0: retry forever). "
            "Enough for a store restart; one log line when it goes and one when it is back.",
        ),
    ] = 300.0,
) -> None:
    """Claim rollouts from a store and run the agent on them until stopped (^C, SIGTERM) or --max-rollouts."""
    from agentlightning.agent import load_agent
    from agentlightning.runner import default_worker_prefix

    if ray:
        from agentlightning.ray_fleet import run_fleet_command

        raise typer.Exit(run_fleet_command(store, agent, processes, workers, max_rollouts, token, ray_address))
    if processes > 1:
        child_args = ["runner", "--store", store, "--agent", agent, "--workers", str(workers)]
        child_args += ["--heartbeat-interval", str(heartbeat_interval), "--max-store-outage", str(max_store_outage)]
        if max_rollouts is not None:
            child_args += ["--max-rollouts", str(max_rollouts)]
        # The token travels in the children's environment: argv is readable by every user (/proc/<pid>/cmdline).
        env = {**os.environ, TOKEN_ENV: token} if token is not None else None
        prefix = worker_id or default_worker_prefix()
        argvs = [[*child_args, "--worker-id", f"{prefix}-p{i}"] for i in range(processes)]
        raise typer.Exit(_run_processes(argvs, env=env))
    try:
        lit_agent = load_agent(agent)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--agent") from exc
    outage = max_store_outage or None
    stats, gave_up = asyncio.run(
        _run_runner(lit_agent, store, token, workers, max_rollouts, heartbeat_interval, worker_id, quiet, outage)
    )
    if gave_up is not None:
        typer.echo(f"error: runner stopped: {gave_up}", err=True)
        raise typer.Exit(1)
    if not quiet:
        make_console().print(
            f"runner done: {stats.succeeded} succeeded, {stats.failed} failed, {stats.timed_out} timed out, "
            f"{stats.lost} not recorded"
        )


def _run_processes(argvs: list[list[str]], *, env: dict[str, str] | None = None) -> int:
    """Start one ``agl runner`` process per argv (with ``env``, else ours); forward ^C/SIGTERM; the worst exit code."""
    command = [sys.executable, "-m", "agentlightning.cli"]
    children = [subprocess.Popen([*command, *argv, "--quiet"], env=env) for argv in argvs]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return max(child.wait() for child in children)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


async def _run_runner(
    agent: Any,
    store_spec: str,
    token: str | None,
    workers: int,
    max_rollouts: int | None,
    heartbeat_interval_s: float,
    worker_id: str | None,
    quiet: bool,
    max_store_outage_s: float | None,
) -> tuple[RunnerStats, str | None]:
    """The runner's stats, and why it gave up on its own (None: it did not)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentlightning.client import StoreUnavailableError
    from agentlightning.runner import AttemptOutcome, Runner
    from agentlightning.store import open_store

    store = open_store(store_spec, token=token)
    try:  # the start-up probe: a wrong URL or token is one line now, not a retry loop
        await store.statistics()
    except (StoreUnavailableError, PermissionError) as exc:
        await store.close()
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), disable=quiet, transient=True
    ) as progress:
        bar = progress.add_task(f"runner ({workers} workers): waiting for rollouts", total=None)
        counts = {"succeeded": 0, "other": 0}

        def on_attempt(outcome: AttemptOutcome) -> None:
            counts["succeeded" if outcome.status == "succeeded" else "other"] += 1
            progress.update(
                bar, description=f"runner ({workers} workers): {counts['succeeded']} succeeded, {counts['other']} not"
            )

        runner = Runner(
            agent,
            store,
            n_workers=workers,
            worker_id=worker_id,
            heartbeat_interval_s=heartbeat_interval_s,
            on_attempt=on_attempt,
            max_store_outage_s=max_store_outage_s,
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, runner.stop)
        try:
            return await runner.run(max_rollouts=max_rollouts), runner.gave_up
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            # The process is stopping: a late SIGTERM (a supervisor's, or one `agl runner --processes` forwards)
            # asks for nothing more, and its default action would cut the store's close short and exit -15.
            # ^C still interrupts.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            await store.close()
