"""The verl training loop on CPU: real store, runners, proxy, router and batch code; verl's GPU engine faked.

The engine fake stands in for what needs GPUs (FSDP workers, vLLM replicas); its replicas are the fake OpenAI
upstream, so everything between the agent and verl's ``DataProto`` runs for real.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("verl", reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)")

import httpx

from agentlightning.agent import rollout
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeOpenAI, FakeOpenAIServer, FakeReply, FakeRequest
from agentlightning.tracing import get_tracer
from agentlightning.trainer import Trainer
from agentlightning.types import LLM, ResourcesSnapshot, Transition
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.retokenize import ChatRetokenizer
from agentlightning_trainer.torch_backend.hf_tokenizer import HFChatTokenizer
from agentlightning_trainer.verl import engine as engine_module, smoke
from agentlightning_trainer.verl.algorithm import VerlLightningRL
from agentlightning_trainer.verl.batch import transitions_to_batch
from agentlightning_trainer.verl.settings import VerlSettings
from tests.trainer.conftest import save_word_tokenizer


class FakeEngine:
    """verl's engine without GPUs: records the batches it would train on; the checksum counts updates."""

    replicas: ClassVar[list[FakeOpenAIServer]] = []
    last: ClassVar[FakeEngine | None] = None
    tokenizer_for_tests: ClassVar[Any] = None  # the HF tokenizer the engine would load (None: none loaded)

    def __init__(self, config: LightningRLConfig, settings: VerlSettings) -> None:
        self.config = config
        self.batches: list[Any] = []
        self.transitions: list[Transition] = []
        self.steps: list[int] = []
        self.stopped = False
        self.served_model = "wrong-name-until-discovered"
        self.tokenizer: Any = FakeEngine.tokenizer_for_tests
        FakeEngine.last = self

    def connect(self) -> None:
        """Nothing to join."""

    def start(self) -> None:
        """Nothing to build."""

    @property
    def addresses(self) -> list[str]:
        return [replica.url for replica in self.replicas]

    def train_step(self, transitions: Sequence[Transition], step: int) -> dict[str, float]:
        self.batches.append(transitions_to_batch(transitions, pad_token_id=0, size_multiple=2))
        self.transitions.extend(transitions)
        self.steps.append(step)
        return {"actor/pg_loss": 0.25}

    def actor_checksum(self) -> float:
        return float(len(self.steps))

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def replicas(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeOpenAIServer]]:
    counter = itertools.count()

    def reply(request: FakeRequest) -> FakeReply:
        return FakeReply(text=str(next(counter)))  # different answers, so rewards differ within a task

    with ExitStack() as stack:
        servers = [stack.enter_context(FakeOpenAI(reply=reply, policy_version=None).serve()) for _ in range(2)]
        monkeypatch.setattr(FakeEngine, "replicas", servers)
        monkeypatch.setattr(engine_module, "VerlEngine", FakeEngine)
        yield servers


def test_two_steps_from_agent_to_verl_batch(replicas: list[FakeOpenAIServer]) -> None:
    config = LightningRLConfig(
        backend="verl",
        policy=PolicySpec(kind="hf", hf_model="/models/qwen", model_name="policy"),
        steps=2,
        tasks_per_step=3,
        samples_per_task=2,
        max_prompt_tokens=512,
        max_response_tokens=8,
        rollout_timeout_s=30.0,
    )
    algorithm = VerlLightningRL(config, show_progress=False)
    Trainer(algorithm, store=InMemoryLightningStore(), n_runners=4).fit(smoke.multiply_agent, smoke.make_tasks(6, 0))
    engine = FakeEngine.last
    assert engine is not None and engine.stopped
    assert [m.step for m in algorithm.history] == [1, 2]
    assert all(m.transitions == 6 and m.rollouts == 6 and m.failed_rollouts == 0 for m in algorithm.history)
    assert algorithm.version == 2 and engine.steps == [1, 2]
    assert algorithm.checksums == [0.0, 1.0, 2.0]
    assert algorithm.history[0].extra == {"actor/pg_loss": 0.25}
    # every rollout reached a replica under the served name, with the proxy's request for token ids
    bodies = [body for replica in replicas for body in replica.fake.requests]
    assert len(bodies) == 12 and {body["model"] for body in bodies} == {"fake-model"}
    assert all(body["return_token_ids"] is True and body["max_tokens"] == 8 for body in bodies)
    first, second = engine.batches
    assert len(first) == 6  # 3 tasks x 2 samples, one call each (already a multiple of 2)
    uids = first.non_tensor_batch["uid"].tolist()
    assert len(set(uids)) == 3 and all(uids.count(u) == 2 for u in uids)
    assert first.batch["response_mask"].sum().item() > 0
    # the second step's calls were served by the weights of version 1: the router stamped it, the spans kept it
    assert algorithm.history[1].policy_lag == 0.0
    assert "rollout_log_probs" in set(second.batch.keys())


@rollout
def foreign_agent(task: dict[str, int], resources: ResourcesSnapshot) -> float:
    """Calls the model on the proxy's plain route (nothing recorded) and traces the call as OpenInference does."""
    llm = resources.resources["llm"]
    assert isinstance(llm, LLM)  # the published one, not the attempt's copy (whose URL records a span)
    question = f"pick a tool {task['a']}"
    body = {"model": llm.model, "messages": [{"role": "user", "content": question}], "max_tokens": 4}
    answer = httpx.post(f"{llm.base_url_for(None, None)}/chat/completions", json=body, timeout=60.0)
    answer.raise_for_status()
    reply = answer.json()["choices"][0]["message"]["content"]
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": question,
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": reply,
    }
    with get_tracer("openinference.instrumentation.openai").start_as_current_span(
        "ChatCompletion", attributes=attributes
    ):
        pass
    return float(reply)  # the replicas answer 0, 1, 2, ...: samples of one task never tie


def test_calls_without_token_ids_are_re_tokenised_with_the_verl_models_tokenizer(
    replicas: list[FakeOpenAIServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers: Any = pytest.importorskip("transformers")
    save_word_tokenizer(tmp_path)
    monkeypatch.setattr(FakeEngine, "tokenizer_for_tests", transformers.AutoTokenizer.from_pretrained(tmp_path))
    config = LightningRLConfig(
        backend="verl",
        policy=PolicySpec(kind="hf", hf_model="/models/qwen", model_name="policy"),
        steps=1,
        tasks_per_step=3,
        samples_per_task=2,
        max_response_tokens=4,
        rollout_timeout_s=30.0,
        retokenize="all",  # the spans record no usage: unverified calls train only when asked to
    )
    algorithm = VerlLightningRL(config, show_progress=False)
    Trainer(algorithm, store=InMemoryLightningStore(), n_runners=3).fit(foreign_agent, smoke.make_tasks(3, 0))
    engine = FakeEngine.last
    assert engine is not None and len([body for r in replicas for body in r.fake.requests]) == 6
    (step,) = algorithm.history
    assert step.transitions == 6 and step.extra["retokenized_trained"] == 6.0 and step.policy_lag == 0.0
    (batch,) = engine.batches
    assert len(batch) == 6 and batch.batch["response_mask"].sum().item() > 0
    retokenizer = algorithm.adapter.retokenizer
    assert isinstance(retokenizer, ChatRetokenizer) and isinstance(retokenizer.tokenizer, HFChatTokenizer)
    assert retokenizer.tokenizer.hf is engine.tokenizer
    # "pick a tool <n>" rendered by the model's chat template, as verl's vLLM renders the request
    ids = engine.tokenizer.convert_tokens_to_ids(["user:", "pick", "a", "tool", "<unk>", "assistant:"])
    assert all(t.prompt_token_ids == ids and t.policy_version == 0 for t in engine.transitions)
