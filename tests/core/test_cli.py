"""`agl`: help of every command, inspecting a seeded SQLite store, `agl dev` on a tiny agent module."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlightning import semconv
from agentlightning.cli import app
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.types import AttemptStatus, Rollout, Span

WIDE = {"COLUMNS": "300"}  # rich tables wrap ids at the default 80 columns
COMMANDS = ["store", "proxy", "fake-openai", "runner", "rollouts", "spans", "check", "dev", "train"]


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["agl", *COMMANDS])
def test_help(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    if not command:
        for name in COMMANDS:
            assert name in result.output


def test_import_is_light() -> None:
    code = (
        "import sys, agentlightning.cli; "
        "print(sorted({'fastapi', 'uvicorn', 'httpx', 'sqlite3', 'opentelemetry'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _reward_span(rollout_id: str, attempt_id: str, value: float) -> Span:
    now = time.time_ns()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id="ab" * 16,
        span_id=f"{len(rollout_id):016x}",
        name=semconv.SPAN_REWARD,
        start_time=now,
        end_time=now + 1000,
        attributes={semconv.reward_attribute("reward"): value, semconv.REWARD_PRIMARY: "reward"},
    )


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[Path, list[str]]:
    """A SQLite store with one succeeded rollout (reward 0.75) and one failed one."""
    path = tmp_path / "store.db"

    async def seed() -> list[str]:
        store = SqliteLightningStore(path)
        try:
            ok = await store.enqueue_rollout({"q": "2+2"}, mode="train")
            bad = await store.enqueue_rollout({"q": "1/0"}, mode="val")
            outcomes: list[tuple[Rollout, AttemptStatus]] = [(ok, "succeeded"), (bad, "failed")]
            for rollout, status in outcomes:
                claimed = await store.claim_rollout("seed-w0")
                assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
                attempt = claimed.attempt
                await store.start_attempt(rollout.rollout_id, attempt.attempt_id)
                if status == "succeeded":
                    await store.add_spans([_reward_span(rollout.rollout_id, attempt.attempt_id, 0.75)])
                error = None if status == "succeeded" else "ZeroDivisionError: division by zero"
                await store.finish_attempt(rollout.rollout_id, attempt.attempt_id, status, error=error)
            return [ok.rollout_id, bad.rollout_id]
        finally:
            await store.close()

    return path, asyncio.run(seed())


def test_rollouts_lists_a_seeded_store(seeded: tuple[Path, list[str]]) -> None:
    path, (ok, bad) = seeded
    result = CliRunner().invoke(app, ["rollouts", "--store", str(path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert ok in result.output and bad in result.output
    assert "0.7500" in result.output
    assert "ZeroDivisionError: division by zero" in result.output
    only_failed = CliRunner().invoke(app, ["rollouts", "--store", str(path), "--status", "failed"], env=WIDE)
    assert bad in only_failed.output and ok not in only_failed.output
    as_url = CliRunner().invoke(app, ["rollouts", "--store", f"sqlite:///{path}"], env=WIDE)  # the factory's form
    assert as_url.exit_code == 0 and ok in as_url.output, as_url.output


def test_spans_lists_a_rollout(seeded: tuple[Path, list[str]]) -> None:
    path, (ok, _) = seeded
    result = CliRunner().invoke(app, ["spans", ok, "--store", str(path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert semconv.SPAN_REWARD in result.output and "reward.reward=0.75" in result.output


def test_inspection_errors_teach(tmp_path: Path, seeded: tuple[Path, list[str]]) -> None:
    missing = CliRunner().invoke(app, ["rollouts", "--store", str(tmp_path / "nope.db")], env=WIDE)
    assert missing.exit_code != 0 and "agl store" in missing.output
    missing_url = CliRunner().invoke(app, ["rollouts", "--store", f"sqlite:///{tmp_path}/nope.db"], env=WIDE)
    assert missing_url.exit_code != 0 and "no SQLite store" in missing_url.output
    assert not (tmp_path / "nope.db").exists()
    redis = CliRunner().invoke(app, ["rollouts", "--store", "redis://h:1"], env=WIDE)
    assert redis.exit_code == 2 and "unknown scheme 'redis'" in redis.output
    unknown = CliRunner().invoke(app, ["spans", "ro-unknown", "--store", str(seeded[0])], env=WIDE)
    assert unknown.exit_code == 1 and "ro-unknown" in unknown.output


def test_an_unreachable_store_is_one_line_not_a_traceback() -> None:
    agl = [sys.executable, "-m", "agentlightning.cli"]
    for command in (["rollouts"], ["spans", "ro-x"], ["check"]):
        done = subprocess.run([*agl, *command, "--store", "http://127.0.0.1:9"], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
        [line] = done.stderr.splitlines()
        assert line.startswith("error: store server at http://127.0.0.1:9") and "agl store" in line


def test_runner_probes_the_store_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "tiny_agent_mod.py").write_text(AGENT_MODULE)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", "runner", "--store", "http://127.0.0.1:9", "--agent",
         "tiny_agent_mod:tiny"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: store server at http://127.0.0.1:9") and "agl store" in line
    assert time.monotonic() - started < 30  # it used to retry forever, a traceback every few seconds


def test_check_exits_non_zero_when_nothing_is_trainable(seeded: tuple[Path, list[str]]) -> None:
    result = CliRunner().invoke(app, ["check", "--store", str(seeded[0])], env=WIDE)
    assert result.exit_code == 1, result.output
    # the fix's pip extras survive rich (its markup used to eat "[langchain]": `pip install "agent-lightning", , , )`)
    assert 'pip install "agent-lightning[langchain]", [autogen], [openai-agents], [crewai]' in result.output


AGENT_MODULE = """
from agentlightning import emit_message, rollout

AGENT_NAME = "tiny"

@rollout
def tiny(task):
    emit_message("thinking about " + task["q"])
    return 1.0 if task["q"] == "easy" else 0.0
"""


def test_dev_runs_a_tiny_agent_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny_agent_mod.py").write_text(AGENT_MODULE)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"q": q}) for q in ("easy", "hard", "easy")) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        app, ["dev", "--agent", "tiny_agent_mod:tiny", "--tasks", str(tasks), "--workers", "2"], env=WIDE
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("succeeded") >= 3
    assert "1.0000" in result.output and "0.0000" in result.output  # rewards found per rollout
    assert "no transitions" in result.output  # no LLM calls: dev says what to do about it


FAILING_MODULE = """
from agentlightning import rollout

@rollout
def broken(task):
    raise RuntimeError("tool [search] failed: " + "x" * 60)
"""


def test_dev_table_reads_at_80_columns_and_prints_errors_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_agent_mod.py").write_text(FAILING_MODULE)
    (tmp_path / "tiny_agent_mod.py").write_text(AGENT_MODULE)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "easy"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for agent, status in (("broken_agent_mod:broken", "failed"), ("tiny_agent_mod:tiny", "succeeded")):
        result = CliRunner().invoke(app, ["dev", "--agent", agent, "--tasks", str(tasks)], env={"COLUMNS": "80"})
        rows = [line for line in result.output.splitlines() if line[:1] in "┏┃┡│└"]  # the tables' lines
        assert rows and max(len(line) for line in rows) <= 80, result.output
        assert any(status in line and "ro-" in line for line in rows), result.output  # not wrapped over lines
        if status == "failed":  # the error whole, markup and all, under the table
            assert "RuntimeError: tool [search] failed: " + "x" * 60 in result.output.replace("\n", "")


def test_dev_rejects_a_bad_agent_spec(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n')
    result = CliRunner().invoke(app, ["dev", "--agent", "no_colon_here", "--tasks", str(tasks)], env=WIDE)
    assert result.exit_code != 0 and "module:function" in result.output


def test_train_runs_the_baseline_on_an_embedded_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny_agent_mod2.py").write_text(AGENT_MODULE)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "easy"}\n{"q": "hard"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = ["train", "--agent", "tiny_agent_mod2:tiny", "--tasks", str(tasks), "--runners", "2"]
    result = CliRunner().invoke(app, [*args, "--algorithm", "agentlightning.algorithms:BaselineAlgorithm"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "baseline run" in result.output and "0.5000" in result.output
    assert list(tmp_path.glob("runs/*/store.db"))
    no_tasks = CliRunner().invoke(app, ["train", "--agent", "tiny_agent_mod2:tiny"], env=WIDE)
    assert no_tasks.exit_code != 0 and "--tasks" in no_tasks.output
    not_algorithm = CliRunner().invoke(app, [*args, "--algorithm", "tiny_agent_mod2:AGENT_NAME"], env=WIDE)
    assert not_algorithm.exit_code != 0 and "gave str" in not_algorithm.output


def test_troubleshooting_page_covers_every_check_diagnosis() -> None:
    from agentlightning.adapter import check

    page = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    # Each diagnosis's opening words, as `agl check` prints them (FIX_NO_TOKEN_IDS follows "no token ids: ").
    heads = [check.FIX_NO_SPANS.split(":")[0], check.FIX_NO_CALLS.split(":")[0], check.FIX_NO_REWARD]
    heads += ["no token ids", "lack token ids", "prompts over max_prompt_tokens", "responses over max_response_tokens"]
    heads += ["no readable reward", "no calls matched", "without gen_ai.response.id cannot be joined"]
    heads += ["foreign-convention spans without what an LLM or tool call needs"]
    heads += ["GenAI log records whose LLM span never arrived"]
    for head in heads:
        assert head in page, head
