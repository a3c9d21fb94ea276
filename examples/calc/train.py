"""Train the calc agent of ``agent.py`` with Agent Lightning. This file is the only one that knows Agent Lightning.

The wiring is three things: ``agentlightning_autogen.instrument()`` (records AutoGen's agent and tool spans and every
model call), a ``@rollout`` function that runs the unmodified agent with the rollout's model and returns 1 for the
exact answer, and ``Trainer.fit`` with LightningRL. The agent's two calculator calls form one trajectory (the second
prompt extends the first with the call and its result): ``transitions="trajectory"`` trains each problem's two
calls as one sequence with the tool result masked out of the loss.

    python -m examples.calc.train                  # CPU: the tiny GPT learns the reduced task (~1-2 min)
    python -m examples.calc.train --dev            # one pass against a fake upstream; span trees printed
    python -m examples.calc.train --model Qwen/Qwen2.5-1.5B-Instruct --backend verl   # GPU
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from rich.console import Console

import agentlightning_autogen
from agentlightning import LLM, rollout
from agentlightning_trainer import LightningRLConfig
from agentlightning_trainer.tool_calls import format_tool_call
from examples import _training
from examples._cli import ExampleCommand
from examples._dev import run_dev
from examples._training import TrainOutcome
from examples.calc import problems
from examples.calc.agent import SYSTEM_MESSAGE, solve

# The tiny GPT's replies: one calculator call per operation, each one token (the compact call format the policy
# server parses into tool_calls), so a random policy can hit the right call.
CALLS: Final = tuple(format_tool_call("calculator", {"operation": op}, compact=True) for op in problems.OPERATIONS)


def exact_answer(answer: str, expected: float) -> float:
    """1.0 when the agent's final answer is the expected number, else 0.0 (a calculator error is wrong)."""
    try:
        return 1.0 if abs(float(answer.strip()) - expected) < 1e-9 else 0.0
    except ValueError:
        return 0.0


@rollout(name="calc-agent")
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve one word problem with the unmodified agent and the rollout's model; reward = exact answer."""
    answer = await solve(
        task["problem"],
        base_url=llm.base_url,
        model=llm.model,
        temperature=float(llm.sampling.get("temperature", 0.0)),
        max_tokens=int(llm.sampling.get("max_tokens", 64)),
    )
    return exact_answer(answer, float(task["answer"]))


def vocabulary() -> tuple[str, ...]:
    """Whole-word tokens of the tiny GPT: every word of the instructions and templates, plus one token per
    calculator call (as the quickstart's tool names: a random policy can hit one)."""
    texts = [SYSTEM_MESSAGE, *(template for template, _ in problems.TEMPLATES), *problems.NAMES, *problems.THINGS]
    return _training.tiny_gpt_words([*texts, "tools: calculator"], whole=CALLS, pattern=r"[a-z]+")


def cpu_tasks(seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training problems and held-out validation problems (same templates, other names, objects and numbers)."""
    train, val = problems.train_val(n_train=8, n_val=2, seed=seed)
    return [p.as_task() for p in train], [p.as_task() for p in val]


def cpu_config(
    steps: int = 40, seed: int = 0, run_dir: Path | None = None, transitions: str = "trajectory"
) -> LightningRLConfig:
    """The CPU settings: the tiny GPT with this example's words, batches sized for a 2-core machine."""
    return _training.cpu_config(
        # Each reply is one calculator-call token (the policy's reply_words, constrained decoding); with free
        # replies the one-step version of this task rose only 0.00 -> 0.22 in a CI run (README). lr 5e-4, half the
        # default: at 1e-3 validation peaked and fell back (seed 0: 0.64 at step 30, 0.36 at 40); at 5e-4 it rose
        # steadily on seeds 0/1/2: +0.50/+0.57/+0.64 (README table).
        vocabulary(), steps=steps, seed=seed, run_dir=run_dir, max_seq_len=160, max_prompt_tokens=130,
        reply_words=CALLS, max_response_tokens=1, transitions=transitions, lr=5e-4,
    )  # fmt: skip


def gpu_config(model: str, *, backend: str, steps: int, seed: int = 0, run_dir: Path) -> LightningRLConfig:
    """Settings for a Hugging Face model on a GPU (validated here; running them needs the GPU)."""
    return _training.gpu_config(
        model, backend=backend, steps=steps, seed=seed, run_dir=run_dir, max_prompt_tokens=512, max_response_tokens=64
    )


def train_cpu(
    steps: int = 40,
    seed: int = 0,
    run_dir: Path | None = None,
    console: Console | None = None,
    transitions: str = "trajectory",
    **options: Any,
) -> TrainOutcome:
    """Train the tiny GPT on the CPU task; validation (greedy) runs on held-out problems."""
    run_dir = run_dir or _training.default_run_dir("calc")
    train_tasks, val_tasks = cpu_tasks(seed)
    config = cpu_config(steps, seed, run_dir, transitions)
    return _training.fit(
        config, calc_agent, train_tasks, val_tasks, instrumentation=agentlightning_autogen, run_dir=run_dir,
        console=console, **options,
    )  # fmt: skip


def train_gpu(model: str, *, backend: str, steps: int, seed: int, run_dir: Path, console: Console) -> TrainOutcome:
    """Train a Hugging Face model on generated problems (held-out validation) on a GPU."""
    config = gpu_config(model, backend=backend, steps=steps, seed=seed, run_dir=run_dir)
    train_tasks = [p.as_task() for p in problems.problems(50, seed=seed)]
    val_tasks = [p.as_task() for p in problems.problems(10, seed=seed + 1000)]
    return _training.fit(
        config, calc_agent, train_tasks, val_tasks, instrumentation=agentlightning_autogen, run_dir=run_dir,
        store=str(run_dir / "store.db"), console=console,
    )  # fmt: skip


def scripted_upstream(operations: dict[str, list[str]]) -> Any:
    """The fake upstream's scripted solver: for each problem, the calculator call of the step it is at."""
    import json

    from agentlightning.testing.fake_openai import FakeReply, FakeRequest, FakeToolCall

    def reply(request: FakeRequest) -> FakeReply:
        steps = operations.get(request.last_user_text, ["plus", "plus"])
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        call = FakeToolCall("calculator", json.dumps({"operation": steps[min(done, len(steps) - 1)]}))
        return FakeReply(tool_calls=[call])

    return reply


async def dev_async(
    n_tasks: int = 2, *, run_dir: Path | None = None, console: Console | None = None
) -> tuple[list[Any], list[Any]]:
    """Run ``n_tasks`` problems once against the fake upstream through the LLM proxy; print each span tree."""
    del run_dir  # nothing to keep: the problems are generated in memory
    train_tasks, _ = cpu_tasks()
    reply = scripted_upstream({t["problem"]: list(t["operations"]) for t in train_tasks})
    return await run_dev(
        calc_agent, train_tasks, reply, n_tasks=n_tasks, instrumentation=agentlightning_autogen, console=console
    )


# The command line (``examples/_cli.py``): CPU training by default, ``--model`` for a GPU, ``--dev``.
COMMAND = ExampleCommand(
    "calc", "Train the AutoGen calculator agent with LightningRL.", "exact answer", 40, train_cpu, train_gpu, dev_async
)

if __name__ == "__main__":
    COMMAND.main()
