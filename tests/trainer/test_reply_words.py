"""``PolicySpec.reply_words``: the tiny GPT generates only those tokens and scores them the same way for training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.torch_backend.policy import Policy

WORDS = ("billing", "shipping", "returns", "my card was charged twice")
REPLY = ("billing", "shipping", "returns", "<|end|>")


def _prompts(policy: Policy, n: int) -> list[list[int]]:
    return [policy.tokenizer.encode_chat([{"role": "user", "content": "my card was charged twice"}])] * n


def test_sampled_and_greedy_replies_use_only_reply_words() -> None:
    policy = Policy.build(PolicySpec(words=WORDS, reply_words=REPLY), seed=3)
    allowed = {policy.tokenizer.encode(w)[0] for w in REPLY}
    generations = policy.generate(
        _prompts(policy, 64),
        temperatures=[1.0] * 63 + [0.0],
        max_new_tokens=[6] * 64,
        generator=torch.Generator().manual_seed(0),
    )
    sampled = {token for g in generations for token in g.token_ids}
    assert sampled <= allowed
    assert sampled == allowed  # 64 x 6 draws hit every allowed word
    # The probabilities of the allowed tokens sum to 1: logprobs are those of the restricted distribution.
    prompt = _prompts(policy, 1)[0]
    with torch.no_grad():
        logits, _ = policy.forward(torch.tensor([prompt]), torch.ones(1, len(prompt)))
    probs = torch.softmax(logits[0, -1], dim=-1)
    assert float(probs[sorted(allowed)].sum()) == pytest.approx(1.0, abs=1e-6)


def test_without_the_end_token_every_reply_runs_to_max_tokens() -> None:
    policy = Policy.build(PolicySpec(words=WORDS, reply_words=REPLY[:-1]), seed=2)
    generations = policy.generate(_prompts(policy, 16), temperatures=[1.0] * 16, max_new_tokens=[5] * 16)
    assert all(len(g.token_ids) == 5 and g.finish_reason == "length" for g in generations)


def test_training_scores_match_the_sampling_logprobs() -> None:
    policy = Policy.build(PolicySpec(words=WORDS, reply_words=REPLY), seed=1)
    prompts = _prompts(policy, 8)
    generations = policy.generate(
        prompts, temperatures=[1.0] * 8, max_new_tokens=[4] * 8, generator=torch.Generator().manual_seed(1)
    )
    logprobs, _, mask = policy.response_scores(prompts, [g.token_ids for g in generations])
    for i, g in enumerate(generations):
        assert logprobs[i, : len(g.logprobs)].tolist() == pytest.approx(g.logprobs, abs=1e-5)
        assert mask[i].sum() == len(g.token_ids)


def test_weights_load_into_a_policy_with_or_without_the_restriction(tmp_path: Path) -> None:
    restricted = Policy.build(PolicySpec(words=WORDS, reply_words=REPLY), seed=0)
    torch.save(restricted.module.state_dict(), tmp_path / "weights.pt")
    free = Policy.build(PolicySpec(words=WORDS), seed=5)
    free.module.load_state_dict(torch.load(tmp_path / "weights.pt"))  # the mask is config, not a weight


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"words": WORDS, "reply_words": ("ship",)}, "'ship' is 4 tokens"),
        ({"words": WORDS, "reply_words": ()}, "nothing to say"),
        ({"kind": "hf", "hf_model": "org/model", "reply_words": REPLY}, "tiny GPT"),
    ],
)
def test_bad_reply_words_are_refused_clearly(spec: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, ValidationError), match=message):
        Policy.build(PolicySpec.model_validate(spec))
