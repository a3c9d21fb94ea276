"""The tiny GPT scores GRPO's K replies per prompt on one shared prompt pass, with the full pass's results."""

from __future__ import annotations

import pytest
import torch

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.torch_backend.policy import Policy

WORDS = ("billing", "shipping", "returns", "my card was charged twice", "where is my parcel")


def _scores(
    policy: Policy, prompts: list[list[int]], responses: list[list[int]], *, shared: bool, entropy: bool
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Scores and the gradients of their sum, through the shared-prompt path or the full-sequence one."""
    policy.module.zero_grad(set_to_none=True)
    with pytest.MonkeyPatch.context() as patch:
        if not shared:
            patch.setattr(Policy, "_tiny_scores_shared", lambda *_, **__: None)
        if entropy:
            out = list(policy.response_scores_with_entropy(prompts, responses, temperature=0.7))
        else:
            out = list(policy.response_scores(prompts, responses, temperature=0.7))
    sum(o.sum() for o in out if o.requires_grad).backward()  # type: ignore[union-attr]
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None}
    return [o.detach() for o in out], grads


@pytest.mark.parametrize("reply_words", [None, ("billing", "shipping", "returns", "<|end|>")])
@pytest.mark.parametrize("entropy", [False, True])
def test_shared_prompt_scores_and_gradients_equal_the_full_pass(
    reply_words: tuple[str, ...] | None, entropy: bool
) -> None:
    policy = Policy.build(PolicySpec(words=WORDS, reply_words=reply_words), seed=4)
    short = policy.tokenizer.encode_chat([{"role": "user", "content": "billing"}])
    long = policy.tokenizer.encode_chat([{"role": "user", "content": "my card was charged twice where is my parcel"}])
    prompts = [long, short, long, short, long, long]  # two tasks, interleaved, prompts of different lengths
    generations = policy.generate(
        prompts, temperatures=[1.0] * 6, max_new_tokens=[1, 6, 3, 2, 5, 4], generator=torch.Generator().manual_seed(3)
    )
    responses = [g.token_ids for g in generations]
    assert len({len(r) for r in responses}) > 2  # replies of several lengths: right padding is exercised
    full, full_grads = _scores(policy, prompts, responses, shared=False, entropy=entropy)
    shared, shared_grads = _scores(policy, prompts, responses, shared=True, entropy=entropy)
    assert torch.equal(full[2], shared[2])  # the response mask
    for a, b in zip(full, shared, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-5)
    # And both equal the logprobs the replies were sampled with (at temperature 1 here).
    logprobs, _, _ = policy.response_scores(prompts, responses)
    for i, g in enumerate(generations):
        assert logprobs[i, : len(g.logprobs)].tolist() == pytest.approx(g.logprobs, abs=1e-5)
    assert full_grads.keys() == shared_grads.keys() and full_grads
    for name, grad in full_grads.items():
        assert torch.allclose(grad, shared_grads[name], atol=1e-5), name


def test_distinct_prompts_take_the_full_pass() -> None:
    policy = Policy.build(PolicySpec(words=WORDS), seed=0)
    prompts = [policy.tokenizer.encode_chat([{"role": "user", "content": w}]) for w in WORDS[:3]]
    assert policy._tiny_scores_shared(prompts, [[5], [6, 7], [8]], 1.0, with_entropy=False) is None
