"""``agl``: serve a store or the LLM proxy, run runners, inspect a store, check readiness, dev-run and train an agent.

Importing this module stays light: every command imports what it needs (server, store backends, rich) when it runs.
A store is named by URL (``http://127.0.0.1:4747``, served by ``agl store``) or by SQLite file path.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from agentlightning.algorithm import Algorithm
    from agentlightning.runner import RunnerStats
    from agentlightning.store.base import LightningStore
    from agentlightning.types import Span

T = TypeVar("T")
# Only free text wraps: ids are copied into other commands and short fields are unreadable when broken.
_WRAPPING_COLUMNS = frozenset({"last error", "name", "attributes"})
# Same variable as agentlightning.server.TOKEN_ENV; not imported from there to keep `agl --help` free of FastAPI.
TOKEN_ENV = "AGENTLIGHTNING_TOKEN"

app = typer.Typer(
    name="agl",
    help="Agent Lightning: train the AI agents you already have.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        help="Store: http(s)://host:port, postgresql://user@host/db, or a SQLite file path.",
        show_default=True,
    ),
]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar=TOKEN_ENV, help=f"Bearer token of the store server (env {TOKEN_ENV}).")
]


def _console() -> Console:
    from rich.console import Console

    return Console()


def _open_inspected_store(spec: str, token: str | None) -> LightningStore:
    """A store to read: a URL or DSN, or an existing SQLite file (never create an empty one by mistake)."""
    from agentlightning.store import open_store

    path = spec.removeprefix("sqlite:///")
    if "://" not in path and not Path(path).exists():
        raise typer.BadParameter(
            f"no SQLite store at {spec!r}; pass an existing store file, or the URL of a running `agl store`",
            param_hint="--store",
        )
    try:
        return open_store(spec, token=token)
    except ValueError as exc:  # an unknown scheme: the message lists the forms
        raise typer.BadParameter(str(exc), param_hint="--store") from exc


def _with_store(spec: str, token: str | None, work: Callable[[LightningStore], Awaitable[T]]) -> T:
    """Run ``work`` on the store at ``spec``; an unreachable server is one line on stderr and exit 1 (no traceback)."""
    from agentlightning.client import StoreUnavailableError

    async def run() -> T:
        store = _open_inspected_store(spec, token)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except StoreUnavailableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


# --- servers ---------------------------------------------------------------------------------------------------------
# Written as one line a paragraph: typer's help keeps the single line breaks of a docstring's later paragraphs.
_STORE_HELP = (
    "Serve a LightningStore over HTTP (REST under /v1 and OTLP/HTTP POST /v1/traces).\n\n"
    "The server enforces the rollouts' timeouts itself, with no trainer running: every --watchdog-interval "
    "seconds, attempts that ran past timeout_s are marked timeout, attempts silent (no span, no heartbeat) for "
    "heartbeat_timeout_s are marked unresponsive, and their rollouts are requeued while max_attempts allows, else "
    "failed. Several servers on one database are safe: each attempt is marked once."
)


@app.command("store", help=_STORE_HELP)
def store_command(
    backend: Annotated[
        Literal["sqlite", "memory", "postgres"], typer.Option(help="Storage backend of the server.")
    ] = "sqlite",
    path: Annotated[Path, typer.Option(help="SQLite database file (sqlite backend).")] = Path("runs/store.db"),
    dsn: Annotated[str | None, typer.Option(help="PostgreSQL DSN (postgres backend).")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; anything but loopback requires --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 4747,
    token: TokenOption = None,
    # The default is agentlightning.server.DEFAULT_WATCHDOG_INTERVAL_S, written out to keep `agl --help` light.
    watchdog_interval: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds between the server's watchdog ticks, which end attempts past timeout_s or silent for "
            "heartbeat_timeout_s and requeue them (max_attempts). 0 turns it off (another process must then run one).",
        ),
    ] = 2.0,
) -> None:
    """Serve a LightningStore over HTTP (REST under /v1 and OTLP/HTTP POST /v1/traces)."""
    from agentlightning.server import serve_store

    if backend == "sqlite":
        path.parent.mkdir(parents=True, exist_ok=True)
    serve_store(
        backend=backend,
        path=str(path),
        dsn=dsn,
        host=host,
        port=port,
        token=token,
        watchdog_interval_s=watchdog_interval,
    )


@app.command("proxy")
def proxy_command(
    upstream: Annotated[str, typer.Option(help="OpenAI-compatible base URL of the model server (…/v1).")],
    store: Annotated[str, typer.Option("--store", "-s", help="URL of the store server that receives LLM spans.")],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 4748,
    upstream_timeout: Annotated[
        float,
        typer.Option(
            "--upstream-timeout",
            metavar="SECONDS",
            help="Longest wait for the model server: a whole non-streamed answer, the start of a stream and each gap "
            "between its chunks. A call past it gets a 504 and an ERROR span.",
        ),
    ] = 600.0,
) -> None:
    """Serve the LLM proxy: records every call (with engine token ids) as a span of its rollout."""
    if not upstream_timeout > 0 or upstream_timeout == float("inf"):
        raise typer.BadParameter(
            f"must be a positive number of seconds, got {upstream_timeout}", param_hint="--upstream-timeout"
        )
    from agentlightning.proxy import serve_proxy

    serve_proxy(upstream=upstream, store_url=store, host=host, port=port, upstream_timeout_s=upstream_timeout)


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
        _console().print(
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


# --- inspection ------------------------------------------------------------------------------------------------------
def _format_time(ns: int | None) -> str:
    import datetime

    if ns is None:
        return "-"
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC).strftime("%m-%d %H:%M:%S")


@app.command("rollouts")
def rollouts_command(
    store: StoreOption = "runs/store.db",
    status: Annotated[list[str] | None, typer.Option(help="Only these statuses (repeatable).")] = None,
    mode: Annotated[str | None, typer.Option(help="Only this mode: train, val or test.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Newest rollouts to show.")] = 20,
    token: TokenOption = None,
) -> None:
    """List a store's rollouts, newest first, with attempts, final reward and the last error."""
    from rich.markup import escape
    from rich.table import Table

    from agentlightning.algorithms.baseline import rollout_reward

    async def work(s: LightningStore) -> Table:
        rollouts = await s.query_rollouts(
            status=status,  # pyright: ignore[reportArgumentType]  # typer gives str; the store validates the names
            mode=mode,  # pyright: ignore[reportArgumentType]  # same: validated by the store
            sort="desc",
            limit=limit,
        )
        table = Table(title=escape(f"rollouts in {store} (newest {limit})"))
        for column in ("rollout", "status", "mode", "attempts", "reward", "enqueued UTC", "last error"):
            table.add_column(column, overflow="fold", no_wrap=column not in _WRAPPING_COLUMNS)
        for rollout in rollouts:
            attempts = await s.query_attempts(rollout.rollout_id)
            reward = await rollout_reward(s, rollout.rollout_id)
            table.add_row(
                rollout.rollout_id,
                rollout.status,
                rollout.mode or "-",
                str(len(attempts)),
                "-" if reward is None else f"{reward:.4f}",
                _format_time(rollout.enqueue_time),
                escape((attempts[-1].error or "") if attempts else ""),
            )
        return table

    _console().print(_with_store(store, token, work))


def _span_summary(span: Span) -> str:
    from agentlightning import semconv

    interesting = {
        k: v
        for k, v in span.attributes.items()
        if k.startswith(semconv.REWARD_PREFIX) or k in (semconv.GEN_AI_REQUEST_MODEL, semconv.GEN_AI_AGENT_NAME)
    }
    if span.status.code == "ERROR":
        interesting["status"] = f"ERROR {span.status.message or ''}".strip()
    text = ", ".join(f"{k.removeprefix('agentlightning.')}={v}" for k, v in interesting.items())
    return text if len(text) <= 200 else text[:197] + "..."


@app.command("spans")
def spans_command(
    rollout_id: Annotated[str, typer.Argument(help="The rollout whose spans to show.")],
    store: StoreOption = "runs/store.db",
    attempt: Annotated[str, typer.Option(help="'latest', 'all', or an attempt id.")] = "latest",
    limit: Annotated[int | None, typer.Option(min=1, help="Show at most this many spans.")] = None,
    token: TokenOption = None,
) -> None:
    """List the spans of one rollout in store order."""
    from rich.markup import escape
    from rich.table import Table

    async def work(s: LightningStore) -> Table:
        spans = await s.query_spans(rollout_id, None if attempt == "all" else attempt, limit=limit)
        every = attempt == "all"
        table = Table(title=f"spans of {rollout_id} ({'all attempts' if every else attempt + ' attempt'})")
        columns = ["seq", "attempt", "name", "span", "parent", "ms", "attributes"]
        for column in columns if every else [c for c in columns if c != "attempt"]:
            table.add_column(column, overflow="fold", no_wrap=column not in _WRAPPING_COLUMNS)
        for span in spans:
            duration = span.duration_s
            cells = [
                str(span.sequence_id),
                span.attempt_id,
                escape(span.name),
                span.span_id,
                span.parent_id or "-",
                "-" if duration is None else f"{duration * 1000:.1f}",
                escape(_span_summary(span)),
            ]
            table.add_row(*(cells if every else cells[:1] + cells[2:]))
        return table

    try:
        _console().print(_with_store(store, token, work))
    except ValueError as exc:  # unknown rollout/attempt: the store's message says which ids exist
        _console().print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(1) from exc


@app.command("check")
def check_command(
    store: StoreOption = "runs/store.db",
    agent: Annotated[list[str] | None, typer.Option(help="Train only calls of these agents (repeatable).")] = None,
    token: TokenOption = None,
) -> None:
    """Check that a store's rollouts are trainable (calls, token ids, rewards); exit 1 if nothing is."""
    from agentlightning.adapter import check_store

    console = _console()
    report = _with_store(store, token, lambda s: check_store(s, agents=agent or None))
    report.render(console)
    if not report.trainable:
        raise typer.Exit(1)


# --- dev -------------------------------------------------------------------------------------------------------------
def _load_tasks(path: Path) -> list[Any]:
    """Tasks from a JSON Lines file: one JSON value per line, blank lines skipped."""
    if not path.exists():
        raise typer.BadParameter(f"no tasks file at {str(path)!r}", param_hint="--tasks")
    tasks: list[Any] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(
                f"{path}:{number} is not JSON ({exc.msg}); a tasks file has one JSON value per line",
                param_hint="--tasks",
            ) from exc
    if not tasks:
        raise typer.BadParameter(f"{path} holds no tasks", param_hint="--tasks")
    return tasks


@app.command("dev")
def dev_command(
    agent: Annotated[str, typer.Option(help="The agent to run, as module:function (or module:LitAgentClass).")],
    tasks: Annotated[Path, typer.Option(help="JSON Lines file: one task per line.")],
    workers: Annotated[int, typer.Option(min=1, help="Concurrent runner workers.")] = 4,
    timeout: Annotated[float | None, typer.Option(help="Per-attempt timeout in seconds.")] = None,
    store: Annotated[
        str | None,
        typer.Option("--store", "-s", help="Store URL, postgresql:// DSN or SQLite path; default: in memory."),
    ] = None,
) -> None:
    """Run each task once with the baseline algorithm; print spans, rewards and transitions per rollout."""
    from agentlightning.agent import load_agent
    from agentlightning.trainer import Trainer

    task_list = _load_tasks(tasks)
    try:
        lit_agent = load_agent(agent)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--agent") from exc
    rows = Trainer(store=store, n_runners=workers, token=os.environ.get(TOKEN_ENV)).dev(
        lit_agent, task_list, timeout_s=timeout
    )
    if not any(row.status == "succeeded" for row in rows):
        raise typer.Exit(1)


def _load_attribute(spec: str, param_hint: str) -> object:
    """What ``package.module:attribute`` names, or a BadParameter for ``param_hint``."""
    from agentlightning.agent import import_attribute

    try:
        return import_attribute(spec, param_hint.removeprefix("--"))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=param_hint) from exc


def _load_algorithm(spec: str) -> Algorithm:
    """An :class:`Algorithm` from ``module:attribute``: an instance, a subclass, or a zero-argument factory."""
    from agentlightning.algorithm import Algorithm

    obj = _load_attribute(spec, "--algorithm")
    if callable(obj) and not isinstance(obj, Algorithm):
        obj = obj()
    if not isinstance(obj, Algorithm):
        raise typer.BadParameter(
            f"{spec!r} gave {type(obj).__name__}, not an agentlightning.Algorithm (instance, class or factory)",
            param_hint="--algorithm",
        )
    return obj


def _backend_algorithm(backend: str, config: Path | None, algorithm: str | None) -> Algorithm:
    """LightningRL on ``backend`` from the trainer package (``agl train --backend verl --config run.yaml``)."""
    if algorithm is not None:
        raise typer.BadParameter("pass --backend or --algorithm, not both", param_hint="--backend")
    try:
        from agentlightning_trainer.verl.launch import algorithm_from_cli
    except ImportError as exc:
        hint = '--backend needs the trainer: pip install "agent-lightning[trainer]"'
        raise typer.BadParameter(hint, param_hint="--backend") from exc
    try:
        return algorithm_from_cli(backend, config)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc


@app.command("train")
def train_command(
    algorithm: Annotated[
        str | None,
        typer.Option(help="module:attribute of an Algorithm (instance, class or factory); default: the baseline."),
    ] = None,
    agent: Annotated[
        str | None, typer.Option(help="The agent as module:function; needed unless --role algorithm.")
    ] = None,
    tasks: Annotated[Path | None, typer.Option(help="Training tasks, JSON Lines; needed unless --role runner.")] = None,
    val_tasks: Annotated[Path | None, typer.Option(help="Validation tasks, JSON Lines.")] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            "-s",
            help="Store URL, postgresql:// DSN or SQLite path; default: a new runs/<timestamp>/store.db.",
        ),
    ] = None,
    role: Annotated[
        Literal["both", "algorithm", "runner"], typer.Option(help="What this process runs against the store.")
    ] = "both",
    runners: Annotated[int, typer.Option(min=1, help="In-process runner workers (roles both and runner).")] = 4,
    runner_processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Processes of this machine running --runners workers each, this one included (agents whose Python "
            "work holds the GIL need more than one to use more than one core; needs a SQLite or URL --store).",
        ),
    ] = 1,
    runner_setup: Annotated[
        list[str] | None,
        typer.Option(
            help="module:function each extra runner process calls first, e.g. agentlightning_crewai:instrument "
            "(repeat the option for several).",
        ),
    ] = None,
    token: TokenOption = None,
    backend: Annotated[
        Literal["torch", "verl"] | None,
        typer.Option(help="LightningRL on this backend (agentlightning-trainer), instead of --algorithm."),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="LightningRL settings (JSON/YAML) for --backend.")] = None,
) -> None:
    """Train: run an algorithm and/or runners against one store (``Trainer.fit``); one process or split by role."""
    from agentlightning.agent import load_agent
    from agentlightning.trainer import Trainer

    if role != "algorithm" and agent is None:
        raise typer.BadParameter(f"role {role!r} runs the agent: pass --agent module:function", param_hint="--agent")
    if role != "runner" and tasks is None:
        raise typer.BadParameter(f"role {role!r} runs the algorithm: pass --tasks tasks.jsonl", param_hint="--tasks")
    try:
        lit_agent = None if agent is None or role == "algorithm" else load_agent(agent)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--agent") from exc
    setup: list[Callable[[], object]] = []
    for spec in runner_setup or []:
        step = _load_attribute(spec, "--runner-setup")
        if not callable(step):
            raise typer.BadParameter(f"{spec!r} is not callable", param_hint="--runner-setup")
        setup.append(cast("Callable[[], object]", step))
    if backend is not None and role != "runner":
        chosen = _backend_algorithm(backend, config, algorithm)
    else:
        chosen = None if algorithm is None else _load_algorithm(algorithm)
    trainer = Trainer(
        chosen,
        store=store,
        n_runners=runners,
        role=role,
        token=token,
        runner_processes=runner_processes,
        runner_setup=setup,
    )
    trainer.fit(
        lit_agent,
        None if tasks is None else _load_tasks(tasks),
        None if val_tasks is None else _load_tasks(val_tasks),
    )


def main() -> None:
    """Console entry point of ``agl``."""
    # The current directory is importable, as with `python -m`, so `--agent my_agent:solve` finds ./my_agent.py.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from agentlightning.extras import MissingExtraError

    try:
        app()
    except MissingExtraError as exc:
        # What to install is the whole message; a traceback would bury it.
        print(f"agl: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
