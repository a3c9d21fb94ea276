"""HF causal LMs as trained policies: eval-mode scoring, temperature, KV cache, LoRA publish and exact resume.

Models are built from a config in code (a Llama like SmolLM2, a GPT-2 with dropout), so nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy
from tests.trainer import conftest
from tests.trainer.conftest import save_word_tokenizer

transformers: Any = pytest.importorskip("transformers")
tokenizers: Any = pytest.importorskip("tokenizers")
pytest.importorskip("peft")


@pytest.fixture
def gpt2_dropout_dir(tmp_path: Path) -> Path:
    """A GPT-2 with its stock dropout of 0.1 everywhere (the case where served and trained logprobs drifted)."""
    path = tmp_path / "gpt2"
    config = transformers.GPT2Config(
        vocab_size=len(conftest.WORDS), n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=1,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    save_word_tokenizer(path)
    return path


def _prompt(policy: Policy) -> list[int]:
    return policy.tokenizer.encode_chat([{"role": "user", "content": "pick a tool"}])


def _transitions(policy: Policy, gens: list[Any], prompt: list[int]) -> list[Transition]:
    out: list[Transition] = []
    for i, g in enumerate(gens):
        t = Transition(
            rollout_id=f"ro-{i}", attempt_id="at-1", group_id="g", turn_index=0, span_id=f"{i:016x}",
            prompt_token_ids=prompt, response_token_ids=g.token_ids, response_logprobs=g.logprobs,
            reward=float(i % 2), advantage=1.0 if i % 2 else -1.0,
        )  # fmt: skip
        out.append(t)
    return out


@pytest.mark.parametrize("fixture", ["llama_dir", "gpt2_dropout_dir"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_served_and_trained_logprobs_agree_at_epoch_one(fixture: str, finetune: str, request: Any) -> None:
    """The learner's first forward (train mode, gradients on) reproduces the sampled logprobs: ratio 1, not noise."""
    spec = PolicySpec(kind="hf", hf_model=str(request.getfixturevalue(fixture)), finetune=finetune)  # type: ignore[arg-type]
    policy = Policy.build(spec)
    prompt = _prompt(policy)
    gen = torch.Generator().manual_seed(0)
    gens = policy.generate([prompt] * 8, temperatures=[1.0] * 8, max_new_tokens=[6] * 8, generator=gen)
    policy.module.train()
    logprobs, _, mask = policy.response_scores([prompt] * 8, [g.token_ids for g in gens])
    for i, g in enumerate(gens):
        assert mask[i].sum() == len(g.token_ids)
        assert torch.allclose(logprobs[i, : len(g.logprobs)], torch.tensor(g.logprobs), atol=1e-3)
    config = LightningRLConfig(policy=spec, samples_per_task=8, lr=1e-3)
    stats = TorchLearner(policy, config).update(_transitions(policy, gens, prompt))
    assert stats["clip_frac"] == 0.0  # every ratio was 1 at the first (only) epoch


def test_logprobs_are_recorded_at_the_sampling_temperature(llama_dir: Path) -> None:
    policy = Policy.build(PolicySpec(kind="hf", hf_model=str(llama_dir)))
    prompt = _prompt(policy)
    gens = policy.generate([prompt] * 4, temperatures=[0.5] * 4, max_new_tokens=[5] * 4)
    responses = [g.token_ids for g in gens]
    at_half, _, _ = policy.response_scores([prompt] * 4, responses, temperature=0.5)
    at_one, _, _ = policy.response_scores([prompt] * 4, responses, temperature=1.0)
    for i, g in enumerate(gens):
        assert torch.allclose(at_half[i, : len(g.logprobs)], torch.tensor(g.logprobs), atol=1e-4)
    assert not torch.allclose(at_half, at_one, atol=1e-3)
    # The learner scores at the config's temperature: an update on these samples starts at ratio 1.
    config = LightningRLConfig(policy=policy.spec, samples_per_task=4, temperature=0.5, epochs=1)
    stats = TorchLearner(policy, config).update(_transitions(policy, gens, prompt))
    assert stats["clip_frac"] == 0.0


def test_kv_cached_generation_matches_full_recomputation(llama_dir: Path) -> None:
    """Greedy replies of the cached loop equal argmax over a full forward pass at every step (ragged prompts)."""
    policy = Policy.build(PolicySpec(kind="hf", hf_model=str(llama_dir)))
    short = _prompt(policy)
    longer = policy.tokenizer.encode_chat(
        [{"role": "system", "content": "pick a tool"}, {"role": "user", "content": "search a calculator"}]
    )
    gens = policy.generate([short, longer], temperatures=[0.0, 0.0], max_new_tokens=[8, 8])
    for prompt, g in zip([short, longer], gens, strict=True):
        seq = list(prompt)
        expected: list[int] = []
        with torch.no_grad():
            for _ in range(len(g.token_ids)):
                logits, _ = policy.module(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
                token = int(logits[0, -1].argmax())
                expected.append(token)
                seq.append(token)
                if token in policy.stop_ids:
                    break
        assert g.token_ids == expected


def test_lora_trains_only_adapters_publishes_them_and_resumes_exactly(llama_dir: Path, tmp_path: Path) -> None:
    spec = PolicySpec(kind="hf", hf_model=str(llama_dir), lora_rank=4, lora_alpha=8)
    policy = Policy.build(spec)
    assert policy.device.type == "cpu" and next(policy.module.parameters()).dtype == torch.float32
    base_before = {k: v.clone() for k, v in policy.module.state_dict().items() if "lora_" not in k}
    prompt = _prompt(policy)
    config = LightningRLConfig(policy=spec, samples_per_task=8, lr=1e-2, kl_coef=0.1, epochs=2)
    learner = TorchLearner(policy, config)
    assert learner.reference is None  # the KL reference is the base with adapters off, not a copy
    gens = policy.generate([prompt] * 8, temperatures=[1.0] * 8, max_new_tokens=[4] * 8)
    stats = learner.update(_transitions(policy, gens, prompt))
    assert stats["kl"] >= 0.0
    after = policy.module.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base_before.items() if "value_head" not in k)
    published = policy.trainable_state_dict()
    assert published and all("lora_" in k or k.startswith("value_head") for k in published)
    total = sum(p.numel() for p in policy.module.parameters())
    assert sum(v.numel() for v in published.values()) < total / 2
    # A second process (the policy server) builds the same spec and loads the adapters: same logprobs.
    learner.save_weights(tmp_path / "weights.pt")
    served = Policy.build(spec, seed=123)
    served.load_trainable_state_dict(torch.load(tmp_path / "weights.pt", weights_only=True))
    responses = [g.token_ids for g in gens]
    assert torch.allclose(
        served.response_scores([prompt] * 8, responses)[0], policy.response_scores([prompt] * 8, responses)[0]
    )
    # Exact resume: a checkpoint of the adapters + optimizer + RNGs continues as the uninterrupted run does.
    learner.save_checkpoint(tmp_path / "ckpt", step=1)
    batch = _transitions(policy, gens, prompt)
    learner.update(batch)
    continued = policy.trainable_state_dict()
    resumed_policy = Policy.build(spec, seed=7)
    resumed = TorchLearner(resumed_policy, config)
    assert resumed.load_checkpoint(tmp_path / "ckpt") is not None
    resumed.update(batch)
    for name, value in resumed_policy.trainable_state_dict().items():
        assert torch.allclose(value, continued[name], atol=1e-6), name


def test_gradient_checkpointing_gives_the_same_update(llama_dir: Path) -> None:
    results = []
    for checkpointing in (False, True):
        spec = PolicySpec(kind="hf", hf_model=str(llama_dir), gradient_checkpointing=checkpointing)
        policy = Policy.build(spec)
        prompt = _prompt(policy)
        gens = policy.generate(
            [prompt] * 4, temperatures=[1.0] * 4, max_new_tokens=[4] * 4, generator=torch.Generator().manual_seed(1)
        )
        TorchLearner(policy, LightningRLConfig(policy=spec, samples_per_task=4, lr=1e-2)).update(
            _transitions(policy, gens, prompt)
        )
        results.append(policy.trainable_state_dict())
    for name, value in results[0].items():
        assert torch.allclose(value, results[1][name], atol=1e-5), name


def test_bad_hf_models_fail_before_any_work(tmp_path: Path, llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="not a HF model folder"):
        LightningRLConfig(policy=PolicySpec(kind="hf", hf_model=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="cannot load HF model"):  # a Policy built from a bare spec says so too
        Policy.build(PolicySpec(kind="hf", hf_model=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="needs hf_model"):
        PolicySpec(kind="hf")
    with pytest.raises(ValueError, match="finetune='lora' is for HF models"):
        PolicySpec(finetune="lora")
    with pytest.raises(ValueError, match="device"):
        PolicySpec(kind="hf", hf_model=str(llama_dir), device="tpu")
    no_template = tmp_path / "no-template"
    for f in llama_dir.iterdir():
        if not f.name.startswith(("tokenizer", "chat_template")):
            (no_template / f.name).parent.mkdir(exist_ok=True)
            (no_template / f.name).write_bytes(f.read_bytes())
    save_word_tokenizer(no_template, template=None)
    with pytest.raises(ValueError, match="no chat template"):
        Policy.build(PolicySpec(kind="hf", hf_model=str(no_template)))


def test_micro_batches_accumulate_to_the_same_update(llama_dir: Path) -> None:
    """Gradient accumulation over micro-batches is the same update as one pass, for both loss aggregations."""
    for aggregation in ("token-mean", "rollout-mean"):
        results = []
        for micro in (None, 3):
            spec = PolicySpec(kind="hf", hf_model=str(llama_dir))
            policy = Policy.build(spec)
            prompt = _prompt(policy)
            gens = policy.generate(
                [prompt] * 8, temperatures=[1.0] * 8, max_new_tokens=[5] * 8, generator=torch.Generator().manual_seed(3)
            )
            batch = _transitions(policy, gens, prompt)
            batch = [t.model_copy(update={"rollout_id": f"ro-{i // 2}"}) for i, t in enumerate(batch)]  # 2 calls each
            config = LightningRLConfig(
                policy=spec, samples_per_task=8, lr=1e-2, micro_batch_size=micro, loss_aggregation=aggregation
            )
            stats = TorchLearner(policy, config).update(batch)
            results.append((policy.trainable_state_dict(), stats["loss"]))
        (first, loss_a), (second, loss_b) = results
        assert abs(loss_a - loss_b) < 1e-6
        for name, value in first.items():
            assert torch.allclose(value, second[name], atol=1e-6), (aggregation, name)


def test_shared_prompt_scoring_equals_separate_passes_with_gradients(llama_dir: Path) -> None:
    """One prompt pass shared by its K replies gives the same logprobs and gradients as K padded passes."""
    policy = Policy.build(PolicySpec(kind="hf", hf_model=str(llama_dir)))
    first = _prompt(policy)
    second = policy.tokenizer.encode_chat([{"role": "user", "content": "search a calculator tool"}])
    prompts = [first, second, first, second, first]
    gens = policy.generate(
        prompts, temperatures=[1.0] * 5, max_new_tokens=[2, 5, 4, 1, 6], generator=torch.Generator().manual_seed(2)
    )
    responses = [g.token_ids for g in gens]
    results = []
    for shared in (True, False):
        if not shared:
            policy.module.score_group = None  # the padded whole-sequence path
        policy.module.zero_grad(set_to_none=True)
        logprobs, values, mask = policy.response_scores(prompts, responses, temperature=0.7)
        (logprobs.sum() + values.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None}
        results.append((logprobs.detach(), values.detach(), mask, grads))
    (lp_a, v_a, m_a, g_a), (lp_b, v_b, m_b, g_b) = results
    assert torch.equal(m_a, m_b)
    assert torch.allclose(lp_a, lp_b, atol=1e-5) and torch.allclose(v_a, v_b, atol=1e-5)
    assert g_a.keys() == g_b.keys() and g_a
    for name, grad in g_a.items():
        assert torch.allclose(grad, g_b[name], atol=1e-4), name


@pytest.mark.parametrize("kind", ["hf", "tiny_gpt"])
def test_repeated_prompts_are_prefilled_once_with_the_same_replies(kind: str, llama_dir: Path) -> None:
    """K copies of a prompt share one prefill; greedy replies and logprobs equal those of the prompt alone."""
    spec = PolicySpec(kind="hf", hf_model=str(llama_dir)) if kind == "hf" else PolicySpec(words=("pick", "tool"))
    policy = Policy.build(spec)
    a = _prompt(policy)
    b = policy.tokenizer.encode_chat([{"role": "user", "content": "search a calculator tool"}])
    batch = [a, b, a, a, b]
    together = policy.generate(batch, temperatures=[0.0] * 5, max_new_tokens=[6] * 5)
    for prompt, g in zip(batch, together, strict=True):
        (alone,) = policy.generate([prompt], temperatures=[0.0], max_new_tokens=[6])
        assert g.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(alone.logprobs), atol=1e-5)
