"""`agl dev --policy SPEC`: the trainer's policy server, untrained, serves the agent through the LLM proxy (#27)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning import semconv
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.dev_policy import policy_spec_from

REPO = Path(__file__).resolve().parents[2]
AGENT = """
from openai import OpenAI
from agentlightning import LLM, rollout


@rollout
def agent(task: dict, llm: LLM) -> float:
    client = OpenAI(base_url=llm.base_url, api_key="unused")
    answer = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=4
    )
    return 1.0 if answer.choices[0].message.content is not None and llm.model == "llama" else 0.0
"""


def test_policy_spec_forms(tmp_path: Path, llama_dir: Path) -> None:
    assert policy_spec_from("smollm2") == PolicySpec(kind="hf", hf_model="smollm2", model_name="smollm2")
    folder = policy_spec_from(str(llama_dir))
    assert (folder.kind, folder.hf_model, folder.model_name) == ("hf", str(llama_dir.resolve()), "llama")
    written = tmp_path / "spec.json"
    written.write_text(PolicySpec(words=("a", "b")).model_dump_json())
    assert policy_spec_from(str(written)).words == ("a", "b")
    (tmp_path / "empty").mkdir()
    for bad, complaint in (
        (str(tmp_path / "empty"), "without config.json"),
        (str(tmp_path / "missing"), "names no policy"),
        ("gpt-4o", "names no policy"),
    ):
        with pytest.raises(ValueError, match=complaint):
            policy_spec_from(bad)
    (tmp_path / "bad.json").write_text('{"kind": "rnn"}')
    with pytest.raises(ValueError, match="not a valid PolicySpec"):
        policy_spec_from(str(tmp_path / "bad.json"))


def test_agl_dev_serves_the_untrained_policy_through_the_proxy(tmp_path: Path, llama_dir: Path) -> None:
    (tmp_path / "policy_agent.py").write_text(AGENT, encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"q": "pick a tool"}\n')
    args = ["dev", "--agent", "policy_agent:agent", "--tasks", "tasks.jsonl", "--store", "store.db"]
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(REPO / "core"), "."])}
    done = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", *args, "--policy", str(llama_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1.0000" in done.stdout, done.stdout

    async def llm_span_attributes() -> dict[str, object]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            rollout = (await store.query_rollouts())[0]
            spans = await store.query_spans(rollout.rollout_id, "latest")
            return dict(next(s for s in spans if s.attributes.get(semconv.RESPONSE_TOKEN_IDS)).attributes)
        finally:
            await store.close()

    attributes = asyncio.run(llm_span_attributes())
    assert attributes[semconv.GEN_AI_REQUEST_MODEL] == "llama"
    assert attributes[semconv.PROMPT_TOKEN_IDS] and attributes[semconv.RESPONSE_TOKEN_IDS]


def test_agl_dev_policy_refuses_a_bad_spec_and_other_model_options(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "x"}\n')
    env = {**os.environ, "COLUMNS": "300"}
    for extra, complaint in (
        (["--policy", "gpt-4o"], "names no policy"),
        (["--policy", "smollm2", "--fake"], "not both"),
        (["--policy", "smollm2", "--model", "m"], "drop --model"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "agentlightning.cli", "dev", "--agent", "json:dumps", "--tasks", str(tasks), *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert complaint in done.stdout + done.stderr


def test_a_runs_policy_spec_is_served_with_the_weights_beside_it(tmp_path: Path, tool_spec: PolicySpec) -> None:
    """A LightningRL run's ``policy_spec.json`` + ``weights.pt``: the served answers come from those weights."""
    import httpx
    import torch

    from agentlightning_trainer.dev_policy import serve_dev_policy
    from agentlightning_trainer.torch_backend.policy import Policy

    trained, untrained = tmp_path / "run", tmp_path / "bare"
    trained.mkdir()
    untrained.mkdir()
    for folder in (trained, untrained):
        (folder / "policy_spec.json").write_text(tool_spec.model_dump_json())
    policy = Policy.build(tool_spec, seed=0)
    # Weights that differ from what the server builds from the spec on its own (its seed 0): scaled by 3.
    torch.save({k: v * 3 for k, v in policy.trainable_state_dict().items()}, trained / "weights.pt")

    def logprobs(spec_file: Path) -> list[float]:
        with serve_dev_policy(str(spec_file)) as (base_url, model):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "pick a tool"}],
                "max_tokens": 3,
                "temperature": 0,
                "logprobs": True,
            }
            answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=60).json()
        return [item["logprob"] for item in answer["choices"][0]["logprobs"]["content"]]

    assert logprobs(trained / "policy_spec.json") != logprobs(untrained / "policy_spec.json")
