"""Dev mode of the calc example against the fake upstream, and the agent's own parts (calculator, text tool client)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
from pathlib import Path

import pytest
from rich.console import Console

from examples.calc import problems
from examples.calc.agent import calculate, problem_numbers
from examples.calc.train import COMMAND, dev_async, exact_answer, gpu_config


def test_dev_mode_prints_agent_tool_and_llm_spans() -> None:
    out = io.StringIO()
    rows, trees = asyncio.run(dev_async(n_tasks=2, console=Console(file=out, width=200)))
    assert [r.status for r in rows] == ["succeeded", "succeeded"]
    assert all(r.final_reward == 1.0 for r in rows)  # the scripted solver writes the right calculation
    assert all(r.transitions == r.transitions_with_token_ids == 1 for r in rows)  # hook + proxy twins joined
    printed = out.getvalue()
    assert len(trees) == 2
    for expected in (
        "invoke_agent solver agent=solver",
        "chat fake agent=solver (hook)",
        "execute_tool calculator agent=solver tool=calculator",
        "chat fake prompt_tokens=",
        "(proxy)",
        "reward value=1.0",
    ):
        assert expected in printed, expected


def test_every_template_expression_gives_the_answer() -> None:
    for problem in problems.problems(3, seed=5):
        assert problem_numbers(problem.problem) == [float(n) for n in problem.numbers]
        assert calculate(problem.expression, problem.numbers) == problem.answer


def test_calculator_reads_leniently() -> None:
    assert calculate("minus", [30, 12]) == 18  # missing operands: first on the left, second on the right
    assert calculate("second minus", [12, 30]) == 18
    assert calculate("84 / 7", []) == 12
    assert calculate("xq first times second zz", [3, 4]) == 12
    with pytest.raises(ValueError, match="no operator"):
        calculate("first second", [1, 2])
    assert exact_answer("18", 18) == 1.0 and exact_answer("error: no operator", 18) == 0.0


def test_bad_arguments_are_refused_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        COMMAND.parse_args(["--backend", "verl"])
    assert "pass --model" in capsys.readouterr().err
    config = gpu_config("org/model", backend="torch", steps=3, run_dir=tmp_path)
    assert config.policy.kind == "hf" and config.policy.hf_model == "org/model"
    if importlib.util.find_spec("verl") is None:
        with pytest.raises(ValueError, match="verl"):
            gpu_config("org/model", backend="verl", steps=3, run_dir=tmp_path)
