"""``agl rollouts``, ``agl spans`` and ``agl check``: read a store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from agentlightning.store.base import LightningStore
    from agentlightning.types import Span

from agentlightning.cli._common import (
    WRAPPING_COLUMNS,
    StoreOption,
    TokenOption,
    app,
    make_console,
    with_store,
)


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
            table.add_column(column, overflow="fold", no_wrap=column not in WRAPPING_COLUMNS)
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

    make_console().print(with_store(store, token, work))


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
            table.add_column(column, overflow="fold", no_wrap=column not in WRAPPING_COLUMNS)
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
        make_console().print(with_store(store, token, work))
    except ValueError as exc:  # unknown rollout/attempt: the store's message says which ids exist
        make_console().print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(1) from exc


@app.command("check")
def check_command(
    store: StoreOption = "runs/store.db",
    agent: Annotated[list[str] | None, typer.Option(help="Train only calls of these agents (repeatable).")] = None,
    token: TokenOption = None,
    policy: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help="Re-tokenise calls recorded without token ids with this model's tokenizer and chat template "
            "(agentlightning-trainer; 'smollm2', a local HF model folder, or a PolicySpec .json file) and report "
            "drift against their recorded usage, as LightningRL would.",
        ),
    ] = None,
) -> None:
    """Check that a store's rollouts are trainable (calls, token ids, rewards); exit 1 if nothing is."""
    from agentlightning.adapter import check_store

    console = make_console()
    retokenizer = _retokenizer(policy) if policy is not None else None
    report = with_store(store, token, lambda s: check_store(s, agents=agent or None, retokenizer=retokenizer))
    report.render(console)
    if not report.trainable:
        raise typer.Exit(1)


def _retokenizer(spec: str) -> Any:
    """The trainer's retokenizer for ``agl check --policy SPEC`` (its tokenizer only; no model is loaded)."""
    try:
        from agentlightning_trainer.dev_policy import policy_spec_from
        from agentlightning_trainer.retokenize import retokenizer_for_spec
    except ImportError as exc:
        raise typer.BadParameter(
            f"--policy re-tokenises with agentlightning-trainer, which is not installed ({exc}); "
            'pip install "agent-lightning[trainer]"',
            param_hint="--policy",
        ) from exc
    try:
        return retokenizer_for_spec(policy_spec_from(spec))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
