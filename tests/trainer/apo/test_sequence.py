"""Prompt then weights: APO then LightningRL on one store, the same agent code; RL runs with APO's best prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from agentlightning.agent import rollout
from agentlightning.store import InMemoryLightningStore
from agentlightning.testing.fake_openai import FakeOpenAI, FakeOpenAIServer, FakeReply, FakeRequest
from agentlightning.trainer import Trainer
from agentlightning.types import LLM, PromptTemplate
from agentlightning_trainer import tool_choice
from agentlightning_trainer.apo import APO, APOConfig
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.sequence import Sequential

FIX = "Reply with the tool name only."
ANSWERS = dict(tool_choice.REQUESTS)


@rollout
def templated_tool_agent(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> float:
    """The tool-choice agent with its system prompt as a resource."""
    with OpenAI(base_url=llm.base_url, api_key="x", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "system", "content": prompt_template.format()},
                {"role": "user", "content": task["request"]},
            ],
            temperature=llm.sampling.get("temperature", 1.0),
            max_tokens=llm.sampling.get("max_tokens", 32),
        )
    return tool_choice.score(task, reply.choices[0].message.content or "")


@pytest.fixture
def api_model() -> Iterator[FakeOpenAIServer]:
    """A hosted model stand-in that names the right tool only when the system prompt asks for the name alone."""

    def reply(request: FakeRequest) -> FakeReply:
        system = str(request.messages[0].get("content"))
        return FakeReply(text=ANSWERS[request.last_user_text] if FIX in system else "Let me think about it.")

    with FakeOpenAI(reply=reply).serve() as server:
        yield server


@pytest.fixture
def optimizer() -> Iterator[FakeOpenAIServer]:
    """Appends the fix to the template it is asked to edit."""

    def reply(request: FakeRequest) -> FakeReply:
        text = request.last_user_text
        if "Write a short critique" in text:
            return FakeReply(text="The model rambles; ask for the tool name only.")
        current = text.split("<template>\n", 1)[1].split("\n</template>", 1)[0]
        return FakeReply(text=f"<prompt>{current} {FIX}</prompt>")

    with FakeOpenAI(reply=reply).serve() as server:
        yield server


@pytest.mark.timeout(180)
def test_apo_then_rl_on_one_store(
    api_model: FakeOpenAIServer, optimizer: FakeOpenAIServer, tool_spec: PolicySpec, tmp_path: Path
) -> None:
    store = InMemoryLightningStore()
    seed = PromptTemplate(template=tool_choice.SYSTEM_PROMPT)
    apo = APO(
        APOConfig(
            optimizer_base_url=optimizer.base_url,
            optimizer_model="optimizer",
            agent_llm=LLM(base_url=api_model.base_url, model="hosted"),
            seed_templates={"prompt_template": seed},
            rounds=1,
            beam_width=1,
            branch_factor=1,
            train_batch_size=4,
            run_dir=tmp_path / "apo",
        ),
        show_progress=False,
    )
    rl = LightningRL(
        LightningRLConfig(policy=tool_spec, steps=1, tasks_per_step=2, samples_per_task=2, val_every=1),
        run_dir=tmp_path / "rl",
        show_progress=False,
    )
    Trainer(Sequential([apo, rl]), store=store, n_runners=8).fit(
        templated_tool_agent, tool_choice.tasks(), tool_choice.tasks()
    )

    assert apo.seed_reward == 0.0 and apo.best is not None and apo.best.val_reward == 1.0
    best = apo.best.templates["prompt_template"]
    assert best.template.endswith(FIX)
    # LightningRL publishes only its LLM; its rollouts still ran with APO's best prompt (carried by Sequential).
    assert rl.version == 1 and len(rl.val_history) == 2

    async def rl_snapshots() -> list[Any]:
        rollouts = await store.query_rollouts()
        ids = {r.resources_id for r in rollouts if r.group_id and not r.group_id.startswith("apo-")}
        return [await store.get_resources(rid) for rid in ids if rid]

    snapshots = asyncio.run(rl_snapshots())
    assert snapshots
    for snapshot in snapshots:
        assert snapshot.resources["prompt_template"] == best
        llm = snapshot.resources["llm"]
        assert isinstance(llm, LLM) and llm.model == tool_spec.model_name
