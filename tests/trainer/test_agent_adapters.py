"""Per-agent weights on one frozen base: an agent's calls train only its own weights, and agents without weights
of their own are served by the untouched base, so their replies cannot change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy

pytest.importorskip("transformers")
pytest.importorskip("peft")


def _spec(kind: str, llama_dir: Path, adapters: tuple[str, ...]) -> PolicySpec:
    if kind == "hf":
        return PolicySpec(kind="hf", hf_model=str(llama_dir), adapters=adapters)
    return PolicySpec(words=("pick", "a", "tool", "search", "calculator"), adapters=adapters)


def _calls(policy: Policy, agent: str, prompt: list[int], n: int) -> list[Transition]:
    served_by = agent if agent in policy.spec.adapters else None  # an agent without weights gets the base
    gens = policy.generate(
        [prompt] * n, temperatures=[1.0] * n, max_new_tokens=[4] * n, adapters=[served_by] * n,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    out: list[Transition] = []
    for i, g in enumerate(gens):
        t = Transition(
            rollout_id=f"ro-{agent}-{i}", attempt_id="at-1", group_id="g", turn_index=0, span_id=f"{i:016x}",
            agent_name=agent, prompt_token_ids=prompt, response_token_ids=g.token_ids, response_logprobs=g.logprobs,
            reward=float(i % 2), advantage=1.0 if i % 2 else -1.0,
        )  # fmt: skip
        out.append(t)
    return out


@pytest.mark.parametrize("kind", ["hf", "tiny_gpt"])
def test_an_agents_calls_train_only_its_weights_and_the_base_never_moves(kind: str, llama_dir: Path) -> None:
    spec = _spec(kind, llama_dir, ("writer", "rewriter"))
    policy = Policy.build(spec)
    prompt = policy.tokenizer.encode_chat([{"role": "user", "content": "pick a tool"}])
    greedy: dict[str | None, list[int]] = {}
    for agent in (None, "writer", "rewriter"):
        (g,) = policy.generate([prompt], temperatures=[0.0], max_new_tokens=[6], adapters=[agent])
        greedy[agent] = g.token_ids
    assert greedy["writer"] == greedy[None] == greedy["rewriter"]  # every agent starts as the base
    before = policy.trainable_state_dict()
    base_logprobs = policy.response_scores([prompt], [greedy[None]])[0]
    config = LightningRLConfig(policy=spec, samples_per_task=8, lr=5e-2, epochs=3, agents=["writer", "rewriter"],
                               adapter_per_agent=True, kl_coef=0.05)  # fmt: skip
    learner = TorchLearner(policy, config)
    assert learner.reference is None  # the base is the KL reference; no copy
    stats = learner.update(_calls(policy, "writer", prompt, 8) + _calls(policy, "critic", prompt, 2))
    assert stats["dropped_transitions"] == 2.0  # the critic has no weights of its own: its calls never train
    after = policy.trainable_state_dict()
    changed = {
        k.split(".")[0] if kind == "tiny_gpt" else _lora_owner(k) for k in after if not torch.equal(after[k], before[k])
    }
    assert changed == {"writer"}
    # The base (what untrained agents are served with) is bit-for-bit what it was: same greedy reply, same logprobs.
    (g,) = policy.generate([prompt], temperatures=[0.0], max_new_tokens=[6], adapters=[None])
    assert g.token_ids == greedy[None]
    assert torch.equal(policy.response_scores([prompt], [greedy[None]])[0], base_logprobs)
    # Publishing moves every agent's weights; a fresh server-side policy reproduces each agent exactly.
    served = Policy.build(spec, seed=5)
    served.load_trainable_state_dict(after)
    for agent in (None, "writer", "rewriter"):
        mine = policy.response_scores([prompt], [greedy[None]], adapter=agent)[0]
        theirs = served.response_scores([prompt], [greedy[None]], adapter=agent)[0]
        assert torch.allclose(mine, theirs, atol=1e-6), agent


def _lora_owner(name: str) -> str:
    """The adapter a LoRA parameter belongs to (peft names them ...lora_A.<adapter>.weight)."""
    parts = name.split(".")
    return parts[parts.index("lora_A") + 1] if "lora_A" in parts else parts[parts.index("lora_B") + 1]


def test_adapter_per_agent_needs_exact_agent_names() -> None:
    with pytest.raises(ValueError, match="needs the agents"):
        LightningRLConfig(adapter_per_agent=True)
    with pytest.raises(ValueError, match="exact names"):
        LightningRLConfig(adapter_per_agent=True, agents=["writer|rewriter"])
    with pytest.raises(ValueError, match="distinct"):
        PolicySpec(adapters=("a", "a"))
    policy: Any = Policy.build(PolicySpec(words=("pick",), adapters=("a",)))
    with pytest.raises(ValueError, match="no weights for agent 'b'"):
        policy.generate([[1, 2]], temperatures=[0.0], max_new_tokens=[1], adapters=["b"])
