# pyright: reportMissingImports=false
# (omegaconf comes with the optional [verl] extra, absent from the main environment pyright checks)
"""``python -m agentlightning_trainer.verl.smoke MODEL_PATH``: two LightningRL steps with verl on one GPU.

An ordinary agent (plain HTTP to an OpenAI-compatible endpoint) multiplies two-digit numbers; its calls go through
our LLM proxy to verl's vLLM replica. Prints each step's reward and transitions, the actor's parameter checksum
before and after training, and exits non-zero unless the weights changed and every step trained.
``--dry-run`` checks everything that needs no GPU (arguments, the model folder, verl's composed config).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import httpx

from agentlightning.agent import rollout
from agentlightning.types import LLM
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.verl.settings import VerlSettings, verl_overrides

MODEL_NAME = "smoke-policy"


def make_tasks(count: int, seed: int) -> list[dict[str, int]]:
    """Two-digit multiplications: hard enough for a 0.5B model that samples of one task disagree."""
    rng = random.Random(seed)
    return [{"a": rng.randint(12, 99), "b": rng.randint(12, 99)} for _ in range(count)]


def score(task: dict[str, int], reply: str) -> float:
    """1 for the right product, minus 0.001 per reply character (terse answers; samples rarely tie)."""
    numbers = re.findall(r"-?\d+", reply.replace(",", ""))
    correct = 1.0 if numbers and int(numbers[0]) == task["a"] * task["b"] else 0.0
    return correct - 0.001 * len(reply)


@rollout
def multiply_agent(task: dict[str, int], llm: LLM) -> float:
    """Ask the model for a product over the OpenAI chat API; the reward is :func:`score`."""
    body = {
        "model": llm.model,
        "messages": [{"role": "user", "content": f"What is {task['a']} * {task['b']}? Reply with the number only."}],
        "temperature": llm.sampling.get("temperature", 1.0),
        "max_tokens": llm.sampling.get("max_tokens", 16),
    }
    answer = httpx.post(f"{llm.base_url.rstrip('/')}/chat/completions", json=body, timeout=120.0)
    answer.raise_for_status()
    return score(task, answer.json()["choices"][0]["message"]["content"] or "")


def build(args: argparse.Namespace) -> tuple[LightningRLConfig, VerlSettings]:
    """The smoke run's settings: small batches, short answers, one GPU shared by the actor and vLLM."""
    config = LightningRLConfig(
        backend="verl",
        policy=PolicySpec(kind="hf", hf_model=str(args.model_path), model_name=MODEL_NAME),
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        samples_per_task=args.samples_per_task,
        lr=args.lr,
        max_prompt_tokens=256,
        max_response_tokens=args.max_response_tokens,
        val_every=10_000,
        seed=args.seed,
        rollout_timeout_s=180.0,
    )
    settings = VerlSettings(
        n_gpus_per_node=1,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=True,  # CUDA-graph capture costs more than two short steps of sampling save
        max_model_len=1024,
        max_tokens_per_gpu=8192,
        experiment_name="gpu-smoke",
    )
    return config, settings


def check_model_folder(path: Path) -> None:
    """A local Hugging Face model folder (the GPU machine may have no network to fetch one)."""
    if not (path / "config.json").is_file():
        raise SystemExit(f"{path} is not a Hugging Face model folder (no config.json); pass a local model path")


def dry_run(config: LightningRLConfig, settings: VerlSettings) -> None:
    """Print the plan and verl's composed config; needs verl installed, no GPU."""
    from omegaconf import OmegaConf

    from agentlightning_trainer.verl.settings import compose_verl_config

    print(json.dumps(verl_overrides(config, settings), indent=2, default=str))
    composed = compose_verl_config(config, settings)
    resolved = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(resolved, dict)
    rollout_cfg = resolved["actor_rollout_ref"]["rollout"]
    print(
        f"dry run ok: {config.steps} steps x {config.tasks_per_step} tasks x {config.samples_per_task} samples; "
        f"vLLM {rollout_cfg['name']} tp={rollout_cfg['tensor_model_parallel_size']} "
        f"gpu_memory_utilization={rollout_cfg['gpu_memory_utilization']}"
    )


def train(config: LightningRLConfig, settings: VerlSettings, runners: int) -> int:
    """Run the steps; print rewards, transitions and checksums; 0 when the weights changed and every step trained."""
    from agentlightning.store.memory import InMemoryLightningStore
    from agentlightning.trainer import Trainer
    from agentlightning_trainer.verl.algorithm import VerlLightningRL

    algorithm = VerlLightningRL(config, verl=settings)
    started = time.perf_counter()
    trainer = Trainer(algorithm, store=InMemoryLightningStore(), n_runners=runners)
    trainer.fit(multiply_agent, make_tasks(32, config.seed))
    elapsed = time.perf_counter() - started
    for step in algorithm.history:
        update = {k: round(v, 5) for k, v in step.extra.items() if k.split("/")[-1] in ("pg_loss", "grad_norm", "lr")}
        print(
            f"step {step.step}: reward {step.reward_mean:+.3f} | transitions {step.transitions} | rollouts "
            f"{step.rollouts} ({step.failed_rollouts} failed) | policy version {step.policy_version} | "
            f"lag {step.policy_lag:.2f} | rollout {step.rollout_s:.1f}s update {step.update_s:.1f}s | {update}"
        )
    sums = algorithm.checksums
    changed = len(sums) >= 2 and math.isfinite(sums[0]) and math.isfinite(sums[-1]) and sums[-1] != sums[0]
    print(f"actor parameter checksum: before {sums[0]:.9e}, after {sums[-1]:.9e}" if sums else "no checksum")
    print(f"weight update confirmed: {'yes' if changed else 'NO'} (train + push took {elapsed:.0f}s)")
    trained = len(algorithm.history) == config.steps and not any(step.skipped for step in algorithm.history)
    return 0 if changed and trained else 1


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, then dry-run or train."""
    parser = argparse.ArgumentParser(description="Two LightningRL steps with verl on one GPU.")
    parser.add_argument("model_path", type=Path, help="local Hugging Face model folder (Qwen2.5-0.5B-Instruct class)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--samples-per-task", type=int, default=4)
    parser.add_argument("--max-response-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-5, help="large enough that two steps move the weights")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--runners", type=int, default=16, help="concurrent agent workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="check arguments and verl's config; no GPU")
    args = parser.parse_args(argv)
    check_model_folder(args.model_path)
    config, settings = build(args)
    if args.dry_run:
        dry_run(config, settings)
        return 0
    return train(config, settings, args.runners)


if __name__ == "__main__":
    sys.exit(main())
