"""Dev mode of the SQL example against the fake upstream, and the agent's own parts (sketches, routing, data)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
from pathlib import Path

import pytest
from rich.console import Console

from examples.sql import data
from examples.sql.agent import compile_sketch, extract_sql, is_approved
from examples.sql.train import COMMAND, CPU_SKETCHES, cpu_tasks, dev_async, gpu_config


def test_dev_mode_prints_every_agent_tool_and_llm_span(tmp_path: Path) -> None:
    out = io.StringIO()
    rows, trees = asyncio.run(dev_async(n_tasks=2, run_dir=tmp_path, console=Console(file=out, width=200)))
    assert [r.status for r in rows] == ["succeeded", "succeeded"]
    assert all(r.final_reward == 1.0 for r in rows)  # the scripted rewriter writes the gold sketch
    # writer, rewriter and checker each made one call, each joined with its proxy twin (token ids)
    assert all(r.transitions == r.transitions_with_token_ids == 3 for r in rows)
    printed = out.getvalue()
    assert len(trees) == 2
    for expected in (
        "sql-agent",
        "invoke_agent writer",
        "invoke_agent checker",
        "invoke_agent rewriter",
        "agent=writer",
        "agent=checker",
        "agent=rewriter",
        "execute_tool run_query agent=writer tool=run_query",
        "chat fake prompt_tokens=",
        "(proxy)",
        "reward value=1.0",
    ):
        assert expected in printed, expected


def test_sketches_compile_to_the_gold_sql_of_their_questions(tmp_path: Path) -> None:
    db = data.build_database(tmp_path / "company.db")
    sketchable = [q for q in data.questions(db) if q.sketch is not None]
    assert len(data.questions(db)) >= 200 and len(sketchable) >= 80
    for question in sketchable:
        assert question.sketch is not None
        assert data.execution_match(db, compile_sketch(question.sketch), question.gold_sql) == 1.0, question
    assert {t["sketch"] for t in cpu_tasks(db)} == set(CPU_SKETCHES)


def test_sketch_reading_is_lenient_but_not_blind() -> None:
    assert compile_sketch("average salary") == "SELECT AVG(salary) FROM employees"  # "age" inside is not a column
    assert compile_sketch("employees count") == "SELECT COUNT(*) FROM employees"
    assert compile_sketch("xq total") is None  # an aggregate of nothing
    assert compile_sketch("salary") is None
    assert extract_sql("Here:\n```sql\nSELECT 1;\n```") == "SELECT 1;"
    assert extract_sql("the answer is SELECT name FROM employees;") == "SELECT name FROM employees"
    assert is_approved("CORRECT") and is_approved("looks fine")
    assert not is_approved("WRONG: it counts projects") and not is_approved("the query is incorrect")


def test_execution_match_ignores_row_order_and_fails_on_errors(tmp_path: Path) -> None:
    db = data.build_database(tmp_path / "company.db")
    gold = "SELECT name FROM departments ORDER BY name"
    assert data.execution_match(db, "SELECT name FROM departments ORDER BY name DESC", gold) == 1.0
    assert data.execution_match(db, "SELECT nam FROM departments", gold) == 0.0
    assert data.execution_match(db, None, gold) == 0.0
    with pytest.raises(Exception, match="readonly"):
        data.run_sql(db, "DELETE FROM departments")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "verl"], "pass --model"),
        (["--dev", "--model", "org/model"], "takes no --model"),
        (["--model", "not a model"], "neither a local path"),
        (["--steps", "0"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        COMMAND.parse_args(argv)
    assert message in capsys.readouterr().err


def test_gpu_settings_are_validated_here(tmp_path: Path) -> None:
    config = gpu_config("org/model", backend="torch", steps=3, run_dir=tmp_path)
    assert config.policy.kind == "hf" and config.agents == ["writer", "rewriter"]
    if importlib.util.find_spec("verl") is None:
        with pytest.raises(ValueError, match="verl"):
            gpu_config("org/model", backend="verl", steps=3, run_dir=tmp_path)
