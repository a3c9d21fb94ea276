"""Dev mode of the calc example against the fake upstream, and the agent's own parts (the running-total calculator)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
from pathlib import Path

import pytest
from rich.console import Console

from examples.calc import problems
from examples.calc.agent import Calculator, operation_of, problem_numbers
from examples.calc.train import CALLS, COMMAND, cpu_config, dev_async, exact_answer, gpu_config


def test_dev_mode_prints_agent_tool_and_llm_spans() -> None:
    out = io.StringIO()
    rows, trees = asyncio.run(dev_async(n_tasks=2, console=Console(file=out, width=200)))
    assert [r.status for r in rows] == ["succeeded", "succeeded"]
    assert all(r.final_reward == 1.0 for r in rows)  # the scripted solver writes the right calculation
    # two calculator calls per problem, each recorded by the hook and the proxy: the twins are joined
    assert all(r.transitions == r.transitions_with_token_ids == 2 for r in rows)
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


def test_every_template_gives_its_answer_with_the_running_total() -> None:
    for problem in problems.problems(3, seed=5):
        assert problem_numbers(problem.problem) == [float(n) for n in problem.numbers]
        calculator = Calculator(problem_numbers(problem.problem))
        first, second = problem.operations
        assert calculator.step(first) > 0 and float(calculator.step(second)).is_integer()
        assert calculator.total == problem.answer > 0


def test_calculator_reads_leniently_and_refuses_a_step_too_many() -> None:
    assert operation_of("First PLUS second") == "plus" and operation_of("12 * 7") == "times"
    assert operation_of("divide") == "divided" and operation_of("x") == "times"
    with pytest.raises(ValueError, match="no operation"):
        operation_of("first second")
    calculator = Calculator([30, 12, 3])
    assert calculator.step("minus") == 18 and calculator.step("divided") == 6
    with pytest.raises(ValueError, match="every number of the problem is used"):
        calculator.step("plus")
    assert exact_answer("6", 6) == 1.0 and exact_answer("error: no operation", 6) == 0.0


def test_each_calculator_call_is_one_token_of_the_tiny_policy() -> None:
    from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer

    config = cpu_config()
    tokenizer = WordCharTokenizer(config.policy.words)
    assert config.policy.reply_words == CALLS
    assert all(len(tokenizer.encode(call)) == 1 for call in CALLS)
    assert config.transitions == "trajectory"


def test_bad_arguments_are_refused_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        COMMAND.parse_args(["--backend", "verl"])
    assert "pass --model" in capsys.readouterr().err
    config = gpu_config("org/model", backend="torch", steps=3, run_dir=tmp_path)
    assert config.policy.kind == "hf" and config.policy.hf_model == "org/model"
    if importlib.util.find_spec("verl") is None:
        with pytest.raises(ValueError, match="verl"):
            gpu_config("org/model", backend="verl", steps=3, run_dir=tmp_path)
