"""The ``agl`` app and what its commands share: options, the console, opening a store to inspect."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from agentlightning.store.base import LightningStore


T = TypeVar("T")
# Only free text wraps: ids are copied into other commands and short fields are unreadable when broken.
WRAPPING_COLUMNS = frozenset({"last error", "name", "attributes"})
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
UPSTREAM_KEY_ENV = "AGL_UPSTREAM_API_KEY"
UpstreamOption = Annotated[
    str | None,
    typer.Option(
        "--upstream",
        metavar="URL",
        help="OpenAI-compatible base URL (…/v1) of the model the agent calls: agl serves it through the LLM proxy "
        "(every call recorded) and publishes it as resource 'llm'. Needs --model.",
    ),
]
ModelOption = Annotated[
    str | None, typer.Option("--model", help="Model name the agent sends (needed with --upstream; --fake: 'fake').")
]
UpstreamKeyOption = Annotated[
    str | None,
    typer.Option(
        "--upstream-api-key",
        envvar=UPSTREAM_KEY_ENV,
        help=f"Key the proxy sends to --upstream (env {UPSTREAM_KEY_ENV}); it is never published to the store.",
    ),
]
FakeOption = Annotated[
    bool,
    typer.Option(
        "--fake",
        help="Serve the agent the built-in fake model (offline, deterministic; echoes the last user message).",
    ),
]
PolicyOption = Annotated[
    str | None,
    typer.Option(
        "--policy",
        metavar="SPEC",
        help="Serve the agent a trainable policy as it is before training (agentlightning-trainer): 'smollm2', a "
        "local Hugging Face model folder, or a PolicySpec .json file; through the LLM proxy like --upstream.",
    ),
]
FakeToolCallsOption = Annotated[
    bool,
    typer.Option(
        "--fake-tool-calls",
        help="With --fake: call the first tool a request offers (placeholder arguments from its schema) until a "
        "tool result comes back, then echo.",
    ),
]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar=TOKEN_ENV, help=f"Bearer token of the store server (env {TOKEN_ENV}).")
]


def make_console() -> Console:
    from rich.console import Console

    return Console()


def open_inspected_store(spec: str, token: str | None) -> LightningStore:
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


def with_store(spec: str, token: str | None, work: Callable[[LightningStore], Awaitable[T]]) -> T:
    """Run ``work`` on the store at ``spec``; an unreachable server is one line on stderr and exit 1 (no traceback)."""
    from agentlightning.client import StoreUnavailableError

    async def run() -> T:
        store = open_inspected_store(spec, token)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except StoreUnavailableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
