"""Trainer step time against TRL's ``GRPOTrainer``: one GRPO update of the same LoRA model on the same batch.

Run: ``.venv-trl/bin/python -m bench.trl_step`` (``--quick`` for fewer repetitions; the ``.venv-trl`` environment, built
by ``make setup-trl``, holds trl 1.16 and our packages, so both sides run in this one process, alternating, on 2
threads). The model is SmolLM2-135M-Instruct (float32, CPU) with LoRA r=16, alpha=32 on every linear layer; the batch is
32 sequences: 4 tool-choice prompts (``tool_messages`` + ``TOOL_DEFINITIONS``) x 8 completions of exactly 16 tokens,
sampled once by our policy and fed to both with the same rewards and advantages. Both make one optimizer step (AdamW, lr
2e-4, no weight decay, grad-norm clip 1.0) over the 32 rows in 4 micro-batches of 8 (the quickstart's
``micro_batch_size``), with the clipped ratio loss (eps 0.2), token-mean aggregation, temperature 1, no KL (no reference
model scored) and the sampler's logprobs as the old ones (no extra scoring pass).

Timed, ours: ``TorchLearner.update(transitions)`` (epochs=1), the whole call. Timed, TRL: one optimizer step of its
own ``Trainer`` loop, from the ``on_step_begin`` to the ``on_step_end`` callback: four ``GRPOTrainer.training_step``
calls (the first runs ``_generate_and_score_completions``, whose ``rollout_func`` hands back the fixed completions,
so no generation; then rewards, advantages and padding), each ``compute_loss`` + backward, then grad clip,
``optimizer.step``, the scheduler and ``zero_grad``. Excluded on TRL's side: ``train()``'s set-up, the data loader's
fetch of the prompt rows and the logging after the step; on ours, computing advantages (the adapter does it). One
``train()`` runs every TRL step; our update runs from the ``on_step_end`` callback, outside TRL's timed window.
Ours groups each micro-batch's rows by prompt and runs a shared prompt once (``HFCausalLM.score_group``); TRL
shuffles the rows and scores every row's prompt in full. TRL loads the model by path from our cached folder (linked
into a temporary one whose config drops the GGUF ``quantization_config``; see ``_trainable_copy``). Prints median
wall time (the ratio) and CPU time (all threads; the machine is shared). Target: TRL's time / ours >= 1.0x.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from bench._util import summarize

TARGET_RATIO = 1.0
TASKS, SAMPLES, NEW_TOKENS, MICRO_BATCH = 4, 8, 16, 8
LR, LORA_RANK, LORA_ALPHA = 2e-4, 16, 32


def _trainable_copy(source: Path, target: Path) -> str:
    """``source`` (the cached HF folder) linked file by file into ``target``, its config without the GGUF
    ``quantization_config`` the conversion leaves behind: the weights are dequantised float32, but with that entry
    transformers' ``Trainer`` refuses the model ("quantized with QuantizationMethod.GGUF ... do not support
    training")."""
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "config.json":
            (target / item.name).symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    config.pop("quantization_config", None)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return str(target)


def main() -> None:
    """Measure both and print the median step times and the ratio against the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    args = parser.parse_args()
    torch.set_num_threads(2)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16

    try:
        import datasets
        import peft
        import transformers
        import trl
    except ImportError as exc:
        raise SystemExit(
            f"{exc}: run this in the TRL environment, which `make setup-trl` builds: "
            ".venv-trl/bin/python -m bench.trl_step"
        ) from exc

    from agentlightning.adapter import grpo_advantages
    from agentlightning.types import Transition
    from agentlightning_trainer import tool_choice
    from agentlightning_trainer.config import LightningRLConfig, PolicySpec
    from agentlightning_trainer.torch_backend.learner import TorchLearner
    from agentlightning_trainer.torch_backend.policy import Policy
    from agentlightning_trainer.torch_backend.pretrained import resolve_model_path

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # transformers 5.24 renamed gradient checkpointing; TRL's config still sets the old name (nothing to act on).
    warnings.filterwarnings("ignore", message=".*is deprecated and will be removed in v6.*", category=FutureWarning)
    spec = PolicySpec(
        kind="hf", hf_model="smollm2", model_name="smollm2", device="cpu", lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA
    )
    policy = Policy.build(spec)

    # The batch: one task per tool, 8 samples each, exactly 16 tokens (no stop token), sampled once.
    tasks = tool_choice.tasks()[:: len(tool_choice.tasks()) // TASKS][:TASKS]
    prompts = [policy.tokenizer.encode_chat(tool_choice.tool_messages(t), tool_choice.TOOL_DEFINITIONS) for t in tasks]
    rows = [p for p in prompts for _ in range(SAMPLES)]
    saved, policy.stop_ids = policy.stop_ids, frozenset({-1})
    try:
        gens = policy.generate(
            rows, temperatures=[1.0] * len(rows), max_new_tokens=[NEW_TOKENS] * len(rows),
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
    finally:
        policy.stop_ids = saved
    assert all(len(g.token_ids) == NEW_TOKENS for g in gens)
    rewards = [float(i % 2) for i in range(len(rows))]  # half of each group right: every advantage is non-zero
    sampled: list[Transition] = []
    for i, g in enumerate(gens):
        sampled.append(Transition(
            rollout_id=f"ro-{i}", attempt_id="at-1", group_id=f"task-{i // SAMPLES}", turn_index=0,
            span_id=f"{i:016x}", prompt_token_ids=rows[i], response_token_ids=g.token_ids,
            response_logprobs=g.logprobs, reward=rewards[i],
        ))  # fmt: skip
    # TRL's (r - mean) / (std + 1e-4) with the unbiased std, so both train on the same advantages.
    transitions = grpo_advantages(sampled, epsilon=1e-4)
    config = LightningRLConfig(
        policy=spec, tasks_per_step=TASKS, samples_per_task=SAMPLES, lr=LR, epochs=1, micro_batch_size=MICRO_BATCH,
        max_prompt_tokens=512, max_response_tokens=NEW_TOKENS,
    )  # fmt: skip
    learner = TorchLearner(policy, config)

    def ours() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        learner.update(transitions)
        return time.perf_counter() - wall, time.process_time() - cpu

    # TRL gets the same prompts by request text, and each prompt's completions in order through rollout_func.
    by_request = {t["request"]: i for i, t in enumerate(tasks)}
    reward_of = {tuple(g.token_ids): r for g, r in zip(gens, rewards, strict=True)}

    def rollout_func(requests: list[str], _trainer: Any) -> dict[str, list[Any]]:
        seen = [0] * TASKS
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for request in requests:
            task = by_request[request]
            g = gens[task * SAMPLES + seen[task]]
            seen[task] += 1
            out["prompt_ids"].append(prompts[task])
            out["completion_ids"].append(g.token_ids)
            out["logprobs"].append(g.logprobs)
        return out

    def fixed_reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
        return [reward_of[tuple(ids)] for ids in completion_ids]

    runs = 3 if args.quick else 5
    a: list[tuple[float, float]] = []  # (wall, CPU) seconds of each update
    b: list[tuple[float, float]] = []

    class Alternate(transformers.TrainerCallback):
        """Times each TRL optimizer step, then runs one of ours outside that window."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            b.append((time.perf_counter() - self.wall, time.process_time() - self.cpu))
            a.append(ours())

    with tempfile.TemporaryDirectory() as out_dir:
        model_dir = _trainable_copy(Path(resolve_model_path("smollm2", None)), Path(out_dir) / "model")
        grpo_args = trl.GRPOConfig(
            output_dir=str(Path(out_dir) / "trl"), use_cpu=True, bf16=False, fp16=False,
            gradient_checkpointing=False, per_device_train_batch_size=MICRO_BATCH,
            gradient_accumulation_steps=TASKS * SAMPLES // MICRO_BATCH, num_generations=SAMPLES, num_iterations=1,
            max_completion_length=NEW_TOKENS, temperature=1.0, beta=0.0, epsilon=0.2, loss_type="dapo",
            scale_rewards="group", learning_rate=LR, weight_decay=0.0, max_grad_norm=1.0,
            lr_scheduler_type="constant", warmup_steps=0, max_steps=runs + 1, logging_steps=10_000,
            save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=0,
            model_init_kwargs={"dtype": torch.float32},
        )  # fmt: skip
        lora = peft.LoraConfig(
            r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear", bias="none",
            task_type="CAUSAL_LM",
        )  # fmt: skip
        trainer = trl.GRPOTrainer(
            model=model_dir, reward_funcs=fixed_reward, args=grpo_args, peft_config=lora, rollout_func=rollout_func,
            train_dataset=datasets.Dataset.from_list([{"prompt": t["request"]} for t in tasks]),
            callbacks=[Alternate()],
        )  # fmt: skip
        trainer.remove_callback(transformers.PrinterCallback)  # it would print train()'s summary among our lines
        trainer.train()
    # TRL trained on exactly our batch: every step's prompt + completion tokens went through rollout_func.
    assert trainer.state.num_input_tokens_seen == (runs + 1) * sum(len(r) + NEW_TOKENS for r in rows)
    assert torch.get_num_threads() == 2 and len(a) == len(b) == runs + 1
    # The first of each is the warm-up; CPU time (all threads) is less sensitive to neighbours on a shared machine.
    mine, peer = summarize([w for w, _ in a[1:]]), summarize([w for w, _ in b[1:]])
    mine_cpu, peer_cpu = summarize([c for _, c in a[1:]]), summarize([c for _, c in b[1:]])
    ratio = peer.median / mine.median
    lengths = [len(p) for p in prompts]
    print(
        f"batch {len(rows)} = {TASKS} prompts ({min(lengths)}-{max(lengths)} tokens) x {SAMPLES} completions of "
        f"{NEW_TOKENS} tokens; LoRA r={LORA_RANK}, {MICRO_BATCH}-row micro-batches, 1 optimizer step"
    )
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"peft {peft.__version__}")  # fmt: skip
    print(f"ours TorchLearner.update: {mine.format(2)} s wall, {mine_cpu.format(2)} s CPU")
    print(f"TRL GRPOTrainer step:     {peer.format(2)} s wall, {peer_cpu.format(2)} s CPU")
    print(f"CPU-time ratio {peer_cpu.median / mine_cpu.median:.2f}x")
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    print(f"ratio {ratio:.2f}x; {verdict} the target of {TARGET_RATIO:.1f}x")


if __name__ == "__main__":
    main()
