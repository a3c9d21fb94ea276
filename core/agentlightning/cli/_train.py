"""``agl dev`` and ``agl train``, and the model they serve the agent (``--upstream``/``--model``, ``--fake``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer

if TYPE_CHECKING:
    from agentlightning.algorithm import Algorithm
    from agentlightning.types import LLM

from agentlightning.cli._common import (
    TOKEN_ENV,
    FakeOption,
    FakeToolCallsOption,
    ModelOption,
    PolicyOption,
    TokenOption,
    UpstreamKeyOption,
    UpstreamOption,
    app,
)


# --- the model the agent calls ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _agent_model(
    upstream: str | None,
    model: str | None,
    api_key: str | None,
    fake: bool,
    fake_tool_calls: bool,
    policy: str | None = None,
) -> Generator[LLM | None]:
    """The LLM ``--upstream``/``--model``, ``--fake`` or ``--policy`` name (a fake or a policy served for the
    block), or None for none of them."""
    from agentlightning.types import LLM

    chosen = [name for name, given in (("--upstream", upstream), ("--fake", fake), ("--policy", policy)) if given]
    if len(chosen) > 1:
        raise typer.BadParameter(f"pass one of {' / '.join(chosen)}, not both", param_hint=chosen[-1])
    if policy is not None:
        if model is not None:
            raise typer.BadParameter("--policy names its own model; drop --model", param_hint="--model")
        with _served_policy(policy) as (base_url, name):
            yield LLM(base_url=base_url, model=name)
        return
    if fake_tool_calls and not fake:
        raise typer.BadParameter("--fake-tool-calls scripts the fake model: add --fake", param_hint="--fake-tool-calls")
    if upstream is None and not fake:
        if model is not None:
            raise typer.BadParameter("--model names the model of --upstream URL (or --fake)", param_hint="--model")
        yield None
        return
    if upstream is not None:
        if model is None:
            raise typer.BadParameter("--upstream needs --model NAME, the model the agent sends", param_hint="--model")
        if not upstream.startswith(("http://", "https://")):
            raise typer.BadParameter(f"{upstream!r} is not an http(s):// URL", param_hint="--upstream")
        yield LLM(base_url=upstream, model=model, api_key=api_key)
        return
    from agentlightning.testing import FakeOpenAI, call_offered_tools

    with FakeOpenAI(reply=call_offered_tools if fake_tool_calls else None).serve() as server:
        yield LLM(base_url=server.base_url, model=model or "fake")


@contextlib.contextmanager
def _served_policy(spec: str) -> Generator[tuple[str, str]]:
    """The trainer's policy server on ``spec`` for the block: its base URL and model name."""
    try:
        from agentlightning_trainer.dev_policy import policy_spec_from, serve_dev_policy
    except ImportError as exc:
        raise typer.BadParameter(
            f"--policy serves a policy with agentlightning-trainer, which is not installed ({exc}); "
            'pip install "agent-lightning[trainer]"',
            param_hint="--policy",
        ) from exc
    try:
        policy_spec_from(spec)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
    with serve_dev_policy(spec) as served:
        yield served


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
    upstream: UpstreamOption = None,
    model: ModelOption = None,
    upstream_api_key: UpstreamKeyOption = None,
    fake: FakeOption = False,
    fake_tool_calls: FakeToolCallsOption = False,
    policy: PolicyOption = None,
) -> None:
    """Run each task once with the baseline algorithm; print spans, rewards and transitions per rollout.

    The agent's model: --upstream URL --model NAME, --fake, or --policy SPEC; without any, the store's latest
    resources.
    """
    from agentlightning.agent import load_agent
    from agentlightning.trainer import Trainer

    task_list = _load_tasks(tasks)
    try:
        lit_agent = load_agent(agent)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--agent") from exc
    with _agent_model(upstream, model, upstream_api_key, fake, fake_tool_calls, policy) as llm:
        trainer = Trainer(store=store, n_runners=workers, token=os.environ.get(TOKEN_ENV), llm=llm)
        rows = trainer.dev(lit_agent, task_list, timeout_s=timeout)
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
    upstream: UpstreamOption = None,
    model: ModelOption = None,
    upstream_api_key: UpstreamKeyOption = None,
    fake: FakeOption = False,
    fake_tool_calls: FakeToolCallsOption = False,
    policy: PolicyOption = None,
) -> None:
    """Train: run an algorithm and/or runners against one store (``Trainer.fit``); one process or split by role.

    The agent's model: --upstream URL --model NAME, --fake or --policy SPEC (for algorithms that do not serve their
    own policy, such as APO or the baseline; LightningRL publishes its policy server over it).
    """
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
    if role == "runner" and (upstream is not None or fake or policy is not None):
        hint = "--upstream" if upstream is not None else "--fake" if fake else "--policy"
        raise typer.BadParameter(
            "the model is served by the process that runs the algorithm; runners read it from the store",
            param_hint=hint,
        )
    train_list = None if tasks is None else _load_tasks(tasks)
    val_list = None if val_tasks is None else _load_tasks(val_tasks)
    with _agent_model(upstream, model, upstream_api_key, fake, fake_tool_calls, policy) as llm:
        trainer = Trainer(
            chosen,
            store=store,
            n_runners=runners,
            role=role,
            token=token,
            runner_processes=runner_processes,
            runner_setup=setup,
            llm=llm,
        )
        trainer.fit(lit_agent, train_list, val_list)
