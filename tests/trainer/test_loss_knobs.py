"""The loss knobs peers ship (entropy bonus, dual-clip PPO, truncated importance sampling): hand-computed values on
tiny tensors, and on the tiny GPT that their defaults leave the update bit-for-bit as it was."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from agentlightning.types import Transition
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, LossAggregationName, PolicySpec
from agentlightning_trainer.metrics import StepMetrics
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.losses import (
    aggregate,
    clipped_policy_loss,
    dual_clip,
    entropy_of,
    row_weights,
    truncated_is_weights,
)
from agentlightning_trainer.torch_backend.policy import Generation, Policy


# --- losses.py, by hand ------------------------------------------------------------------------------------------
def test_dual_clip_caps_the_loss_of_a_negative_advantage_at_c() -> None:
    # ratios 5, 2, 0.5, 5 with advantages -1, -1, -1, +1; eps 0.2, c 3
    ratio = torch.tensor([[5.0, 2.0, 0.5, 5.0]])
    advantages = torch.tensor([[-1.0, -1.0, -1.0, 1.0]])
    logprobs = ratio.log().requires_grad_(True)
    ppo, _ = clipped_policy_loss(logprobs, torch.zeros_like(ratio), advantages, 0.2, 0.2)
    # PPO-clip alone: max(-A r, -A clip(r)) = max(5, 1.2), max(2, 1.2), max(0.5, 0.8), max(-5, -1.2)
    assert torch.allclose(ppo, torch.tensor([[5.0, 2.0, 0.8, -1.2]]))
    loss, capped = dual_clip(ppo, advantages, 3.0)
    # min(5, -A c = 3) = 3 for the exploded ratio; the others are under the cap or have A > 0
    assert torch.allclose(loss, torch.tensor([[3.0, 2.0, 0.8, -1.2]]))
    assert capped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    loss.sum().backward()
    assert logprobs.grad is not None
    # The capped token is a constant: no gradient; the unclipped ratio-2 token keeps d(-A r)/dlogp = r = 2.
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0, 0.0])


def test_truncated_is_weights_are_capped_and_detached() -> None:
    recomputed = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]], requires_grad=True)
    served = torch.tensor([[math.log(0.25), math.log(0.3), math.log(0.4)]])
    weights, truncated = truncated_is_weights(recomputed, served, 1.5)
    # exp(recomputed - served) = 2 -> capped at 1.5, 1 (same logprobs), 0.5 (never raised: a truncation, not a clip)
    assert weights[0].tolist() == pytest.approx([1.5, 1.0, 0.5])
    assert truncated.tolist() == [[1.0, 0.0, 0.0]]
    assert not weights.requires_grad


def test_entropy_of_known_distributions() -> None:
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]])
    log_probs = probs.log().requires_grad_(True)  # the zeros are -inf logprobs, as a banned token's would be
    entropy = entropy_of(log_probs)
    # ln 4; 0.5 ln 2 + 2 x 0.25 ln 4 = 1.5 ln 2; 0 (one certain token)
    assert entropy.tolist() == pytest.approx([math.log(4), 1.5 * math.log(2), 0.0])
    entropy.sum().backward()
    assert log_probs.grad is not None and torch.isfinite(log_probs.grad).all()


def test_entropy_bonus_aggregates_like_the_policy_loss() -> None:
    # two rows: 2 tokens of entropy 1 and 3, 1 token of entropy 5 (its second position is padding)
    entropy = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rollouts = torch.tensor([0, 1])
    cases: list[tuple[LossAggregationName, float]] = [("token-mean", (1 + 3 + 5) / 3), ("rollout-mean", (2 + 5) / 2)]
    for mode, expected in cases:
        weights = row_weights(mask, rollouts, mode)
        assert float(((entropy * mask).sum(dim=1) * weights).sum()) == pytest.approx(expected)
        assert float(aggregate(entropy, mask, rollouts, mode)) == pytest.approx(expected)


def test_knob_values_are_validated() -> None:
    for bad in ({"entropy_coef": -0.1}, {"clip_ratio_c": 1.0}, {"tis_cap": 0.5}):
        with pytest.raises(ValidationError):
            LightningRLConfig.model_validate(bad)
    defaults = LightningRLConfig()
    assert (defaults.entropy_coef, defaults.clip_ratio_c, defaults.tis_cap) == (0.0, None, None)


# --- the learner on the tiny GPT ----------------------------------------------------------------------------------
def _transitions(policy: Policy, served: str = "sampled", shift: float = 0.0) -> list[Transition]:
    """Two tasks x 4 samples, advantages +1/-1; served logprobs: the sampler's, the learner's own (eval mode, scored
    as one batch like the learner's) minus ``shift``, or none."""
    prompts: list[list[int]] = []
    gens: list[Generation] = []
    for g, task in enumerate(tool_choice.tasks()[:2]):
        prompt = policy.tokenizer.encode_chat(tool_choice.messages(task))
        prompts += [prompt] * 4
        gens += policy.generate(
            [prompt] * 4, temperatures=[1.0] * 4, max_new_tokens=[4] * 4,
            generator=torch.Generator().manual_seed(g),
        )  # fmt: skip
    own, _, _ = policy.response_scores(prompts, [gen.token_ids for gen in gens])
    out: list[Transition] = []
    for i, (prompt, gen) in enumerate(zip(prompts, gens, strict=True)):
        logprobs = {
            "sampled": gen.logprobs,
            "own": (own[i, : len(gen.token_ids)] - shift).tolist(),
            "none": None,
        }[served]
        call = Transition(
            rollout_id=f"ro-{i}", attempt_id="at-1", group_id=f"g{i // 4}", turn_index=0, span_id=f"{i:016x}",
            prompt_token_ids=prompt, response_token_ids=gen.token_ids, response_logprobs=logprobs,
            reward=float(i % 2), advantage=1.0 if i % 2 else -1.0,
        )  # fmt: skip
        out.append(call)
    return out


def _update(
    policy: Policy, transitions: list[Transition], **knobs: object
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One learner update of a copy of ``policy``: its new weights and the step's stats."""
    trained = copy.deepcopy(policy)
    config = LightningRLConfig.model_validate({"policy": policy.spec, "samples_per_task": 4, **knobs})
    stats = TorchLearner(trained, config).update(transitions)
    return trained.trainable_state_dict(), stats


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _mean_entropy(policy: Policy, transitions: list[Transition]) -> float:
    prompts, responses = [t.prompt_token_ids for t in transitions], [t.response_token_ids for t in transitions]
    with torch.no_grad():
        _, _, mask, entropy = policy.response_scores_with_entropy(prompts, responses)
    return float((entropy * mask).sum() / mask.sum())


@pytest.fixture
def policy(tool_spec: PolicySpec) -> Policy:
    return Policy.build(tool_spec)


def test_default_knobs_give_the_update_of_before_bit_for_bit(policy: Policy) -> None:
    batch = _transitions(policy)
    default, stats = _update(policy, batch)
    explicit, _ = _update(policy, batch, entropy_coef=0.0, clip_ratio_c=None, tis_cap=None)
    assert _same(default, explicit)
    assert not {"entropy", "dual_clip_frac", "tis_truncated_frac"} & stats.keys()
    # The update as it was before the knobs: ratio from the served logprobs, token-mean PPO-clip, AdamW, grad clip.
    before = copy.deepcopy(policy)
    prompts, responses = [t.prompt_token_ids for t in batch], [t.response_token_ids for t in batch]
    width = max(len(r) for r in responses)
    served = torch.zeros((len(batch), width))
    for i, t in enumerate(batch):
        assert t.response_logprobs is not None
        served[i, : len(t.response_logprobs)] = torch.tensor(t.response_logprobs)
    optimizer = torch.optim.AdamW(before.trainable_parameters(), lr=1e-3, weight_decay=0.0)
    before.module.train()
    logprobs, _, mask = before.response_scores(prompts, responses)
    advantages = torch.tensor([t.advantage or 0.0 for t in batch])[:, None] * mask
    per_token, _ = clipped_policy_loss(logprobs, served, advantages, 0.2, 0.2)
    weights = row_weights(mask, torch.arange(len(batch)), "token-mean")
    ((per_token * mask).sum(dim=1) * weights).sum().backward()
    torch.nn.utils.clip_grad_norm_(before.trainable_parameters(), 1.0)
    optimizer.step()
    assert _same(default, before.trainable_state_dict())


def test_entropy_bonus_changes_the_update_and_raises_the_entropy(policy: Policy) -> None:
    batch = _transitions(policy)
    off, _ = _update(policy, batch)
    # A large weight, so the bonus outweighs the policy gradient: the fresh tiny GPT is already near-uniform.
    on, stats = _update(policy, batch, entropy_coef=10.0)
    assert not _same(off, on)
    # The reported entropy is the policy's before the step (one mini-batch), aggregated token-mean.
    assert stats["entropy"] == pytest.approx(_mean_entropy(policy, batch), rel=1e-5)
    after_off, after_on = copy.deepcopy(policy), copy.deepcopy(policy)
    after_off.load_trainable_state_dict(off)
    after_on.load_trainable_state_dict(on)
    assert _mean_entropy(after_on, batch) > _mean_entropy(after_off, batch)
    assert _mean_entropy(after_on, batch) > _mean_entropy(policy, batch)


def test_tis_with_the_learners_own_logprobs_is_a_no_op(policy: Policy) -> None:
    batch = _transitions(policy, served="own")
    off, off_stats = _update(policy, batch)
    on, on_stats = _update(policy, batch, tis_cap=2.0)
    assert _same(off, on)
    assert on_stats["tis_truncated_frac"] == 0.0 and "tis_truncated_frac" not in off_stats
    assert on_stats["logprob_mismatch"] == pytest.approx(0.0, abs=1e-6)


def test_mismatch_is_reported_and_tis_weights_the_loss(policy: Policy) -> None:
    # Served logprobs 0.5 below the learner's: every weight is exp(0.5) = 1.65, truncated to the cap 1.5.
    batch = _transitions(policy, served="own", shift=0.5)
    _, off = _update(policy, batch)
    assert off["logprob_mismatch"] == pytest.approx(0.5, abs=1e-5)  # logged with TIS off too
    _, on = _update(policy, batch, tis_cap=1.5)
    assert on["logprob_mismatch"] == pytest.approx(0.5, abs=1e-5)
    assert on["tis_truncated_frac"] == 1.0
    # With TIS the ratio starts at 1 (the learner's own logprobs), so pg_loss = -1.5 x token-mean advantage.
    tokens = [len(t.response_token_ids) for t in batch]
    mean_advantage = sum((t.advantage or 0.0) * n for t, n in zip(batch, tokens, strict=True)) / sum(tokens)
    assert on["pg_loss"] == pytest.approx(-1.5 * mean_advantage, abs=1e-6)
    step = StepMetrics(
        step=1, reward_mean=0.5, reward_ema=0.5, all_same_frac=0.0, transitions=8, rollouts=8, failed_rollouts=0,
        policy_version=1, policy_lag=0.0, rollout_s=0.1, update_s=0.1, extra=on,
    )  # fmt: skip
    assert step.logprob_mismatch == on["logprob_mismatch"]
    assert step.scalars()["update/logprob_mismatch"] == on["logprob_mismatch"]
    assert "logprob mismatch 0.5" in step.update_summary()


def test_without_served_logprobs_tis_is_a_no_op_and_no_mismatch_is_reported(policy: Policy) -> None:
    batch = _transitions(policy, served="none")
    off, off_stats = _update(policy, batch)
    on, on_stats = _update(policy, batch, tis_cap=1.5)
    assert _same(off, on)
    assert "logprob_mismatch" not in off_stats and "logprob_mismatch" not in on_stats
    assert "tis_truncated_frac" not in on_stats


def test_dual_clip_is_reported_and_inert_on_a_fresh_batch(policy: Policy) -> None:
    # On the first step every ratio is ~1 (served = sampled), far below c = 3: the dual clip changes nothing yet.
    batch = _transitions(policy)
    off, _ = _update(policy, batch)
    on, stats = _update(policy, batch, clip_ratio_c=3.0)
    assert _same(off, on)
    assert stats["dual_clip_frac"] == 0.0


def test_hf_entropy_is_the_same_on_both_scoring_paths_and_matches_the_logits(llama_dir: Path) -> None:
    pytest.importorskip("peft")
    policy = Policy.build(PolicySpec(kind="hf", hf_model=str(llama_dir)))
    first = policy.tokenizer.encode_chat([{"role": "user", "content": "pick a tool"}])
    second = policy.tokenizer.encode_chat([{"role": "user", "content": "search a calculator tool"}])
    prompts = [first, second, first]
    gens = policy.generate(
        prompts, temperatures=[1.0] * 3, max_new_tokens=[2, 5, 4], generator=torch.Generator().manual_seed(2)
    )
    responses = [g.token_ids for g in gens]
    with torch.no_grad():
        plain = policy.response_scores(prompts, responses, temperature=0.7)
        shared = policy.response_scores_with_entropy(prompts, responses, temperature=0.7)  # one pass per prompt
        module: Any = policy.module
        module.score_group = None  # the padded whole-sequence path
        padded = policy.response_scores_with_entropy(prompts, responses, temperature=0.7)
        # By hand: each reply's own unpadded forward; the entropy of softmax(logits / 0.7) where it predicts a token
        for i, (prompt, reply) in enumerate(zip(prompts, responses, strict=True)):
            ids = torch.tensor([[*prompt, *reply]])
            logits, _ = policy.module(ids, torch.ones_like(ids))
            log_probs = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float() / 0.7, dim=-1)
            expected = -(log_probs.exp() * log_probs).sum(dim=-1)
            assert torch.allclose(shared[3][i, : len(reply)], expected, atol=1e-4)
    # Asking for the entropy leaves the scores as they were; both paths agree; nothing past a reply's end.
    assert all(torch.equal(a, b) for a, b in zip(shared[:3], plain, strict=True))
    assert torch.allclose(shared[0], padded[0], atol=1e-5) and torch.allclose(shared[3], padded[3], atol=1e-5)
    for got in (shared, padded):
        assert torch.equal(got[3] * got[2], got[3])


# --- verl mapping (the config needs verl installed; the mapping itself does not import it) --------------------------
@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="backend='verl' configs need verl installed")
def test_verl_maps_entropy_and_dual_clip_and_refuses_tis() -> None:
    from agentlightning_trainer.verl.settings import VerlSettings, verl_overrides

    def config(**knobs: object) -> LightningRLConfig:
        spec = PolicySpec(kind="hf", hf_model="Qwen/Qwen2.5-0.5B-Instruct", model_name="policy")
        return LightningRLConfig.model_validate({"backend": "verl", "policy": spec, "samples_per_task": 4, **knobs})

    actor = "actor_rollout_ref.actor"
    default = verl_overrides(config(), VerlSettings())
    assert default[f"{actor}.entropy_coeff"] == 0.0 and f"{actor}.clip_ratio_c" not in default  # verl's own 3.0
    knobs = verl_overrides(config(entropy_coef=0.01, clip_ratio_c=2.5), VerlSettings())
    assert knobs[f"{actor}.entropy_coeff"] == 0.01 and knobs[f"{actor}.clip_ratio_c"] == 2.5
    with pytest.raises(ValueError, match="tis_cap"):
        verl_overrides(config(tis_cap=2.0), VerlSettings())
    with pytest.raises(ValueError, match="entropy bonus"):
        verl_overrides(config(entropy_coef=0.01, loss_aggregation="rollout-mean"), VerlSettings())
