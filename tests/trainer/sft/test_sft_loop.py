"""SFT end to end with the tiny policy: imitating the best rollouts of the tool-choice agent raises greedy accuracy."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agentlightning.store import InMemoryLightningStore
from agentlightning.trainer import Trainer
from agentlightning.types import LLM
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.quickstart.agent import tool_choice_agent
from agentlightning_trainer.sequence import Sequential
from agentlightning_trainer.sft import SFT, SFTConfig


@pytest.mark.timeout(90)
def test_imitating_the_best_rollouts_raises_greedy_accuracy(tool_spec: PolicySpec, tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    # Measured on 3 seeds: greedy accuracy 0.00 → 0.75 / 0.92 / 1.00 after 6 rounds, 32-45 s on 2 cores.
    config = SFTConfig(policy=tool_spec, rounds=6, samples_per_task=16, top_k=4, epochs=8, temperature=0.7, seed=1)
    sft = SFT(config, run_dir=tmp_path, show_progress=False)
    started = time.perf_counter()
    Trainer(sft, store=store, n_runners=32).fit(tool_choice_agent, tool_choice.tasks(), tool_choice.tasks())
    elapsed = time.perf_counter() - started

    before, after = sft.val_history[0][1], sft.val_history[-1][1]
    print(f"SFT greedy accuracy {before:.2f} -> {after:.2f} in {elapsed:.0f} s; {sft.val_history}")
    assert [r for r, _ in sft.val_history] == list(range(7))
    assert before <= 0.25
    assert after >= 0.5 and after >= before + 0.4
    # Engine token ids were present (policy server behind the proxy), so no example was re-tokenised.
    assert all(m.examples == m.engine_examples for m in sft.history)
    assert sft.version == 6
    # Every round published new weights: the LLM snapshots' weights versions climb 0..6.
    snapshots = asyncio.run(store.list_resources())
    versions = sorted(
        {s.resources["llm"].weights_version or 0 for s in snapshots if isinstance(s.resources["llm"], LLM)}
    )
    assert versions == list(range(7))


@pytest.mark.timeout(120)
def test_sft_then_rl_starts_from_the_fine_tuned_weights(tool_spec: PolicySpec, tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    sft = SFT(
        SFTConfig(policy=tool_spec, rounds=2, samples_per_task=16, top_k=4, epochs=8, temperature=0.7, seed=1),
        run_dir=tmp_path / "sft",
        show_progress=False,
    )
    # No checkpoint directory: Sequential hands SFT's weights file over as LightningRL's init_weights.
    rl_config = LightningRLConfig(policy=tool_spec, steps=1, tasks_per_step=12, seed=0, lr=5e-4)
    rl = LightningRL(rl_config, run_dir=tmp_path / "rl", show_progress=False)
    Trainer(Sequential([sft, rl]), store=store, n_runners=32).fit(
        tool_choice_agent, tool_choice.tasks(), tool_choice.tasks()
    )

    sft_after = sft.val_history[-1][1]
    rl_before = rl.val_history[0]
    assert rl_before[0] == 0
    # Greedy answers of the same weights: RL's first validation sees what SFT ended with, not a random model's 0.
    assert sft_after > 0.0 and abs(rl_before[1] - sft_after) <= 1 / 12 + 1e-9
    assert rl.version == sft.version + 1
    assert sft.weights_path is not None and rl.config.init_weights == sft.weights_path


def test_rl_after_sft_with_other_weights_is_refused_up_front(tool_spec: PolicySpec, tmp_path: Path) -> None:
    sft = SFT(SFTConfig(policy=tool_spec, rounds=1), show_progress=False)
    other = PolicySpec(words=tool_spec.words, d_model=32)
    with pytest.raises(ValueError, match="PolicySpec"):
        Sequential([sft, LightningRL(LightningRLConfig(policy=other, steps=1), show_progress=False)])
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"")
    mine = LightningRL(LightningRLConfig(policy=tool_spec, steps=1, init_weights=weights), show_progress=False)
    with pytest.raises(ValueError, match="init_weights"):
        Sequential([sft, mine])
