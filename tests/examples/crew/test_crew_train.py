"""The crew example's CPU training loop trains on the specialist's calls only, though every agent used the policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentlightning.adapter import find_llm_calls
from agentlightning.store.sqlite import SqliteLightningStore
from examples.crew.train import train_cpu


def test_training_step_uses_only_specialist_calls(tmp_path: Path) -> None:
    outcome = train_cpu(steps=1, seed=0, run_dir=tmp_path, store=str(tmp_path / "store.db"), show_progress=False)
    (step,) = outcome.algorithm.history
    assert step.failed_rollouts == 0 and not step.skipped

    async def calls_by_agent() -> dict[str, int]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            counts: dict[str, int] = {}
            for rollout in await store.query_rollouts():
                if rollout.mode != "train":
                    continue
                for call in find_llm_calls(await store.query_spans(rollout.rollout_id, "latest")):
                    assert call.has_token_ids  # planner and critic calls went through the proxy too
                    counts[call.agent_name or "?"] = counts.get(call.agent_name or "?", 0) + 1
            return counts
        finally:
            await store.close()

    counts = asyncio.run(calls_by_agent())
    # CrewAI asks again after an empty reply, so an agent may call more than once per crew
    assert counts["planner"] >= step.rollouts and counts["critic"] >= step.rollouts
    # the learner trained on exactly the specialist's calls: the other agents' calls produced no transitions
    assert step.transitions == counts["specialist"] >= step.rollouts
