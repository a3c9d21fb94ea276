"""Dev mode of the crew example against the fake upstream, and training selects the specialist's calls only."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

import agentlightning_crewai
from agentlightning.adapter import TraceAdapter, find_llm_calls
from examples.crew.agent import TeamDirectoryTool, routed_team
from examples.crew.train import COMMAND, TRAINED_AGENTS, dev_async


@pytest.fixture(scope="module")
def dev_run() -> tuple[list[object], str]:
    out = io.StringIO()
    try:
        rows, _ = asyncio.run(dev_async(n_tasks=2, console=Console(file=out, width=200)))
    finally:
        agentlightning_crewai.uninstrument()
    return rows, out.getvalue()


def test_dev_mode_prints_crew_task_agent_tool_and_llm_spans(dev_run: tuple[list[object], str]) -> None:
    rows, printed = dev_run
    assert [r.status for r in rows] == ["succeeded", "succeeded"]  # type: ignore[attr-defined]
    assert all(r.final_reward == 1.0 for r in rows)  # type: ignore[attr-defined]
    for expected in (
        "crew crew",
        "task Route the ticket",
        "invoke_agent planner",
        "invoke_agent specialist",
        "invoke_agent critic",
        "chat fake agent=specialist",
        "execute_tool team_directory agent=specialist",
        "prompt_tokens=",
        "(proxy)",
        "reward value=1.0",
    ):
        assert expected in printed, expected


def test_only_the_specialist_calls_become_transitions() -> None:
    """Planner and critic calls are recorded with token ids, yet selecting the specialist trains none of them."""
    from agentlightning.store import InMemoryLightningStore
    from examples._dev import run_dev
    from examples.crew.train import crew_agent, fake_reply, tasks

    async def run() -> None:
        store = InMemoryLightningStore()
        rows, _ = await run_dev(
            crew_agent, tasks(), fake_reply, n_tasks=1, instrumentation=agentlightning_crewai,
            console=Console(file=io.StringIO()), timeout_s=120, store=store,
        )  # fmt: skip
        rollout = await store.get_rollout(rows[0].rollout_id)
        spans = await store.query_spans(rollout.rollout_id, "latest")
        calls = find_llm_calls(spans)
        by_agent = sorted(c.agent_name or "" for c in calls)
        assert by_agent == ["critic", "planner", "specialist", "specialist"]
        assert all(c.has_token_ids for c in calls)  # every agent's call could be trained...
        everyone = TraceAdapter().adapt(rollout, spans)
        assert len(everyone) == 4
        selected = TraceAdapter(agents=TRAINED_AGENTS).adapt(rollout, spans)
        assert [t.agent_name for t in selected] == ["specialist", "specialist"]  # ...but only the specialist's are

    asyncio.run(run())


def test_tool_and_routing() -> None:
    assert "billing" in TeamDirectoryTool()._run()
    assert routed_team("Final Answer: Shipping, not billing") == "shipping"
    assert routed_team("no idea") is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "verl"], "pass --model PATH"),
        (["--dev", "--model", "org/model"], "takes no --model"),
        (["--model", "not a model"], "neither a local path"),
    ],
)
def test_gpu_options_are_validated(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        COMMAND.parse_args(argv)
    assert message in capsys.readouterr().err
