"""``agl store``, ``agl proxy`` and ``agl fake-openai``: the servers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

if TYPE_CHECKING:
    pass

from agentlightning.cli._common import TOKEN_ENV, TokenOption, UpstreamKeyOption, app

# --- servers ---------------------------------------------------------------------------------------------------------
# Written as one line a paragraph: typer's help keeps the single line breaks of a docstring's later paragraphs.
_STORE_HELP = (
    "Serve a LightningStore over HTTP (REST under /v1, OTLP/HTTP POST /v1/traces and /v1/logs).\n\n"
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
    """Serve a LightningStore over HTTP (REST under /v1, OTLP/HTTP POST /v1/traces and /v1/logs)."""
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
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="AGL_PROXY_TOKEN",
            help="Bearer token the proxy requires from agents, as their OpenAI API key (env AGL_PROXY_TOKEN); "
            "required beyond loopback.",
        ),
    ] = None,
    store_token: Annotated[
        str | None,
        typer.Option(
            "--store-token", envvar=TOKEN_ENV, help=f"Token of the store server, to write spans (env {TOKEN_ENV})."
        ),
    ] = None,
    upstream_api_key: UpstreamKeyOption = None,
) -> None:
    """Serve the LLM proxy: records every call (with engine token ids) as a span of its rollout.

    The store is probed first: a wrong URL or store token is one line and exit 1. Dropped spans are logged at ERROR
    and counted in GET /metrics.
    """
    if not upstream_timeout > 0 or upstream_timeout == float("inf"):
        raise typer.BadParameter(
            f"must be a positive number of seconds, got {upstream_timeout}", param_hint="--upstream-timeout"
        )
    from agentlightning.client import StoreUnavailableError
    from agentlightning.proxy import serve_proxy
    from agentlightning.proxy.server import resolve_proxy_token

    try:
        token = resolve_proxy_token(host, token)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--token") from exc
    try:
        serve_proxy(
            upstream=upstream,
            store_url=store,
            host=host,
            port=port,
            upstream_timeout_s=upstream_timeout,
            token=token,
            store_token=store_token,
            upstream_api_key=upstream_api_key,
        )
    except (StoreUnavailableError, PermissionError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("fake-openai")
def fake_openai_command(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 4749,
    reply: Annotated[str | None, typer.Option(help="Answer every call with this text (default: echo).")] = None,
    tool_calls: Annotated[
        bool,
        typer.Option(
            "--tool-calls",
            help="Call the first tool a request offers (placeholder arguments from its schema) until a tool result "
            "comes back.",
        ),
    ] = False,
    latency: Annotated[float, typer.Option(min=0, metavar="SECONDS", help="Delay before every answer.")] = 0.0,
) -> None:
    """Serve the built-in fake OpenAI-compatible model: chat completions and Responses, streaming, token ids."""
    if reply is not None and tool_calls:
        raise typer.BadParameter("pass --reply or --tool-calls, not both", param_hint="--reply")
    import uvicorn

    from agentlightning.testing import FakeOpenAI, call_offered_tools

    fake = FakeOpenAI(reply=call_offered_tools if tool_calls else reply, latency_s=latency)
    print(f"fake OpenAI server: base URL http://{host}:{port}/v1 (Ctrl-C stops it)", flush=True)
    uvicorn.run(fake.app, host=host, port=port, log_level="warning", access_log=False)
