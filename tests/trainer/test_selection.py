"""Selective training: with two agents in one rollout and one selected, only the selected agent's calls train."""

from __future__ import annotations

import time
import uuid

import torch

from agentlightning import semconv as sc
from agentlightning.adapter import TraceAdapter
from agentlightning.store import InMemoryLightningStore
from agentlightning.types import Span
from agentlightning_trainer.batches import collect_batch
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import with_advantages
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy


def _span(rollout_id: str, attempt_id: str, name: str, attributes: dict[str, object], at: int) -> Span:
    return Span.model_validate(
        {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "trace_id": uuid.uuid4().hex,
            "span_id": uuid.uuid4().hex[:16],
            "name": name,
            "start_time": at,
            "end_time": at + 1,
            "attributes": attributes,
        }
    )


def _call(rollout_id: str, attempt_id: str, agent: str, prompt: list[int], response: list[int], at: int) -> Span:
    return _span(
        rollout_id,
        attempt_id,
        "chat tiny-gpt",
        {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_AGENT_NAME: agent,
            sc.GEN_AI_RESPONSE_ID: uuid.uuid4().hex,
            sc.PROMPT_TOKEN_IDS: prompt,
            sc.RESPONSE_TOKEN_IDS: response,
            sc.RESPONSE_LOGPROBS: [-1.0] * len(response),
            sc.POLICY_VERSION: 0,
        },
        at,
    )


async def test_only_the_selected_agents_calls_train() -> None:
    store = InMemoryLightningStore()
    rewards = [1.0, 0.0, 1.0, 0.0]
    for _ in rewards:
        await store.enqueue_rollout({"q": "plan then solve"}, mode="train", group_id="task-1")
    for reward in rewards:
        claimed = await store.claim_rollout("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        now = time.time_ns()
        await store.add_spans(
            [
                _call(rid, aid, "planner", [5, 6, 7], [8, 9], now),
                _call(rid, aid, "solver", [5, 6, 7, 8, 9], [10, 2], now + 10),
                _span(
                    rid,
                    aid,
                    sc.SPAN_REWARD,
                    {sc.reward_attribute("reward"): reward, sc.REWARD_PRIMARY: "reward"},
                    now + 20,
                ),
            ]
        )
        await store.finish_attempt(rid, aid, "succeeded")
    rollouts = await store.query_rollouts()
    batch = await collect_batch(store, rollouts, TraceAdapter(agents="solver"))
    assert len(batch.transitions) == 4
    assert {t.agent_name for t in batch.transitions} == {"solver"}
    assert batch.rewards_by_group == {"task-1": rewards}

    everyone = await collect_batch(store, rollouts, TraceAdapter(agents=None))
    assert sorted({t.agent_name or "" for t in everyone.transitions}) == ["planner", "solver"]

    spec = PolicySpec()
    config = LightningRLConfig(policy=spec, samples_per_task=4, tasks_per_step=1)
    policy = Policy.build(spec)
    learner = TorchLearner(policy, config)
    rows, _ = with_advantages(batch.transitions, config)
    stats = learner.update(rows)
    assert stats["trained_transitions"] == 4.0
    # The selected (solver) rows carry the rollout-level GRPO advantages: +/- the same magnitude.
    advantages = sorted(t.advantage or 0.0 for t in rows)
    assert torch.allclose(torch.tensor(advantages), torch.tensor([-0.866, -0.866, 0.866, 0.866]), atol=1e-3)
