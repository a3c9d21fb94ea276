"""APO end to end through Trainer.fit: a scripted optimiser's edits raise validation reward; resources are versioned."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentlightning.store import InMemoryLightningStore
from agentlightning.testing.fake_openai import FakeOpenAIServer
from agentlightning.trainer import Trainer
from agentlightning.types import LLM, PromptTemplate
from agentlightning_trainer.apo import APO, APOConfig
from tests.trainer.apo._word_task import FIXES, SEEDS, tasks, two_agent_system, user_prompt_agent, word_agent


def _config(agent: FakeOpenAIServer, optimizer: FakeOpenAIServer, tmp_path: Path, **fields: object) -> APOConfig:
    return APOConfig.model_validate(
        {
            "optimizer_base_url": optimizer.base_url,
            "optimizer_model": "optimizer",
            "agent_llm": LLM(base_url=agent.base_url, model="agent-model"),
            "run_dir": tmp_path,
            "train_batch_size": 4,
            "seed": 0,
            **fields,
        }
    )


@pytest.mark.timeout(120)
def test_two_templates_both_edited_reward_reaches_target(
    agent_upstream: FakeOpenAIServer, optimizer_upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    store = InMemoryLightningStore()
    config = _config(
        agent_upstream, optimizer_upstream, tmp_path,
        seed_templates=SEEDS, rounds=3, beam_width=2, branch_factor=2, rollout_budget=120, target_reward=1.0,
    )  # fmt: skip
    apo = APO(config, show_progress=False)
    Trainer(apo, store=store, n_runners=8).fit(word_agent, tasks(), tasks()[:4])

    assert apo.seed_reward == 0.0
    assert apo.best is not None and apo.best.val_reward == 1.0
    assert apo.rollouts_used <= 120
    assert apo.val_history[0][0] == 0 and apo.val_history[-1][1] == 1.0
    best = apo.best.templates
    assert FIXES["system_prompt"] in best["system_prompt"].template
    assert FIXES["user_prompt"] in best["user_prompt"].template
    assert best["user_prompt"].placeholders == {"word"}

    # Every candidate that was scored ran as its own resources snapshot; the last snapshot holds the best templates.
    snapshots = asyncio.run(store.list_resources())
    edited = {
        name
        for s in snapshots
        for name, seed in SEEDS.items()
        if isinstance(s.resources.get(name), PromptTemplate) and s.resources[name] != seed
    }
    assert edited == {"system_prompt", "user_prompt"}
    latest = max(snapshots, key=lambda s: s.version)
    assert latest.resources["system_prompt"] == best["system_prompt"]
    assert latest.resources["user_prompt"] == best["user_prompt"]
    # The final snapshot names the agent's model itself (APO's proxy is gone once it returns).
    assert latest.resources["llm"] == LLM(base_url=agent_upstream.base_url, model="agent-model")

    history = json.loads((tmp_path / "history.json").read_text())
    by_id = {c["candidate_id"]: c for c in history}
    chain = [apo.best.candidate_id]
    while by_id[chain[-1]]["parent"] is not None:
        chain.append(by_id[chain[-1]]["parent"])
    assert chain[-1] == "c0" and len(chain) == 3  # seed → one fix → both fixes
    assert all(by_id[c]["critique"] for c in chain[:-1])
    saved = json.loads((tmp_path / "best.json").read_text())
    assert saved["val_reward"] == 1.0 and saved["seed_val_reward"] == 0.0
    assert saved["templates"]["user_prompt"]["template"] == best["user_prompt"].template
    # The scripted optimiser answers "unchanged" once a fix is in: those edits are rejected, never installed.
    rejected = [c for c in history if c["status"] == "rejected"]
    assert all("unchanged" in c["reason"] or "already scored" in c["reason"] for c in rejected)


@pytest.mark.timeout(120)
def test_budget_in_rollouts_is_enforced(
    agent_upstream: FakeOpenAIServer, optimizer_upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    store = InMemoryLightningStore()
    config = _config(
        agent_upstream, optimizer_upstream, tmp_path,
        seed_templates={"user_prompt": SEEDS["user_prompt"]}, rounds=5, beam_width=1, branch_factor=1,
        rollout_budget=14, val_batch_size=4,
    )  # fmt: skip
    apo = APO(config, show_progress=False)
    Trainer(apo, store=store, n_runners=4).fit(user_prompt_agent, tasks(), tasks())

    rollouts = asyncio.run(store.query_rollouts())
    assert len(rollouts) == apo.rollouts_used <= 14
    # seed (4 val) + round 1 (4 train + 4 val) = 12; round 2's training batch would exceed 14.
    assert apo.rollouts_used == 12
    assert apo.best is not None and apo.best.val_reward == 1.0


def test_budget_too_small_for_the_seed_fails_before_any_rollout(
    optimizer_upstream: FakeOpenAIServer, agent_upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    config = _config(agent_upstream, optimizer_upstream, tmp_path, seed_templates=SEEDS, rollout_budget=5)
    store = InMemoryLightningStore()
    with pytest.raises(ValueError, match="rollout_budget 5 cannot pay"):
        Trainer(APO(config, show_progress=False), store=store, n_runners=1).fit(word_agent, tasks(), tasks())
    assert asyncio.run(store.query_rollouts()) == []


@pytest.mark.timeout(120)
def test_one_agent_of_a_multi_agent_system(
    agent_upstream: FakeOpenAIServer, optimizer_upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    store = InMemoryLightningStore()
    planner = PromptTemplate(template="Plan how to repeat the word.")
    config = _config(
        agent_upstream, optimizer_upstream, tmp_path,
        seed_templates={"planner_prompt": planner, "writer_prompt": SEEDS["user_prompt"]},
        optimize=("writer_prompt",), agents="writer", rounds=2, beam_width=1, branch_factor=1, target_reward=1.0,
    )  # fmt: skip
    apo = APO(config, show_progress=False)
    Trainer(apo, store=store, n_runners=4).fit(two_agent_system, tasks(), tasks()[:4])

    assert apo.seed_reward == 0.0 and apo.best is not None and apo.best.val_reward == 1.0
    assert apo.best.templates["planner_prompt"] == planner  # never edited: not in `optimize`
    critiques = [
        str(body["messages"][0]["content"])
        for body in optimizer_upstream.fake.requests
        if "Write a short critique" in str(body["messages"][0]["content"])
    ]
    assert critiques
    # The optimiser is shown the selected agent's calls only.
    assert all("writer-input" in c and "planner-input" not in c for c in critiques)
