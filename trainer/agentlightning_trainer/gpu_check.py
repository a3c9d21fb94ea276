"""``python -m agentlightning_trainer.gpu_check``: the torch backend on a GPU, end to end, with no download.

Builds a randomly initialised Llama-shaped model from a config (``--size 0.5b``: 24 layers, hidden 1024, ~0.44 B
parameters; ``--size tiny`` for a CPU rehearsal) and a word-level tokenizer in code, then runs LoRA GRPO steps
through the whole loop (runners → LLM proxy → policy server → store → adapter → learner → adapter publish). It checks
that the weights and the activations are on the requested device in both processes, and prints generation tokens/s,
update seconds and peak GPU memory. ``scripts/gpu_check.sh`` runs it on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

SIZES: dict[str, dict[str, int]] = {
    "0.5b": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
             "num_key_value_heads": 16, "vocab_size": 32000},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512},
}  # fmt: skip
_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}assistant:"


def build_model_folder(path: Path, size: str) -> Path:
    """A random Llama of ``size`` and a word-level tokenizer whose words include the tool-choice task's, saved."""
    import importlib

    from agentlightning_trainer import tool_choice

    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")

    shape = SIZES[size]
    words = ["<pad>", "<eos>", "<unk>", "system:", "user:", "assistant:"]
    words += [w.strip() for w in tool_choice.vocabulary() if w.strip() not in words]
    words += [f"w{i}" for i in range(shape["vocab_size"] - len(words))]
    vocab = dict.fromkeys(words)
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer: Any = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = _TEMPLATE
    config = transformers.LlamaConfig(
        **{**shape, "vocab_size": len(vocab)}, max_position_embeddings=512, pad_token_id=0, eos_token_id=1,
        bos_token_id=None, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """Run the check; exit 1 when a tensor is not on the device or training did not run."""
    parser = argparse.ArgumentParser(description="The torch backend on a GPU: LoRA GRPO through the policy server.")
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu (a rehearsal with --size tiny)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--run-dir", type=Path, default=Path("runs/gpu-check"))
    args = parser.parse_args(argv)

    from agentlightning.trainer import Trainer
    from agentlightning_trainer import tool_choice
    from agentlightning_trainer.config import LightningRLConfig, PolicySpec
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.quickstart.agent import tool_choice_agent
    from agentlightning_trainer.torch_backend.policy import Policy

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device", file=sys.stderr)
        return 1
    args.run_dir.mkdir(parents=True, exist_ok=True)
    folder = build_model_folder(args.run_dir / "model", args.size)
    spec = PolicySpec(kind="hf", hf_model=str(folder), model_name="gpu-check", device=args.device)
    config = LightningRLConfig(
        policy=spec, steps=args.steps, tasks_per_step=4, samples_per_task=8, lr=1e-4, max_response_tokens=32,
        max_prompt_tokens=256, val_every=args.steps, seed=0,
    )  # fmt: skip

    # Generation speed in this process, on the same model and batch shape the steps use.
    policy = Policy.build(spec)
    params_on = {p.device.type for p in policy.module.parameters()}
    prompt = policy.tokenizer.encode_chat(tool_choice.messages(tool_choice.tasks()[0]))
    logits, _ = policy.module(
        torch.tensor([prompt], device=policy.device), torch.ones(1, len(prompt), dtype=torch.long, device=policy.device)
    )
    activations_on = logits.device.type
    policy.generate([prompt] * 4, temperatures=[1.0] * 4, max_new_tokens=[4] * 4)  # warm-up
    if policy.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    gens = policy.generate([prompt] * 32, temperatures=[1.0] * 32, max_new_tokens=[64] * 32)
    if policy.device.type == "cuda":
        torch.cuda.synchronize()
    gen_s = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in gens)
    del policy

    algorithm = LightningRL(config, run_dir=args.run_dir, show_progress=False)
    started = time.perf_counter()
    Trainer(algorithm, store=args.run_dir / "store.db", n_runners=32).fit(
        tool_choice_agent, tool_choice.tasks(), tool_choice.tasks()[:4]
    )
    trained = algorithm.policy
    assert trained is not None
    report = {
        "device": args.device,
        "size": args.size,
        "parameters": sum(p.numel() for p in trained.module.parameters()),
        "trainable": sum(p.numel() for p in trained.trainable_parameters()),
        "params_on": sorted(params_on),
        "activations_on": activations_on,
        "trained_params_on": sorted({p.device.type for p in trained.trainable_parameters()}),
        "server_device": _server_device(args.run_dir),
        "generation_tokens_per_s": tokens / gen_s,
        "generation_batch": "32 x 64 new tokens",
        "update_s": [round(m.update_s, 2) for m in algorithm.history],
        "rollout_s": [round(m.rollout_s, 2) for m in algorithm.history],
        "steps_trained": sum(1 for m in algorithm.history if not m.skipped),
        "wall_s": time.perf_counter() - started,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
    }
    print(json.dumps(report, indent=2))
    device_type = torch.device(args.device).type
    ok = (
        report["params_on"] == [device_type]
        and report["activations_on"] == device_type
        and report["trained_params_on"] == [device_type]
        and report["server_device"] == device_type
        and report["steps_trained"] == len(algorithm.history) > 0
    )
    print("gpu_check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _server_device(run_dir: Path) -> str | None:
    """The device the policy server reported in its log line (the server process is gone by now)."""
    log = run_dir / "policy_server.log"
    for line in reversed(log.read_text().splitlines() if log.exists() else []):
        if line.startswith("policy server device:"):
            return line.split(":", 1)[1].strip()
    return None


if __name__ == "__main__":
    sys.exit(main())
