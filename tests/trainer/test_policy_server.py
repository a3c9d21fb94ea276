"""The policy server speaks the token-id contract, batches, answers greedily at temperature 0, hot-swaps weights."""

from __future__ import annotations

from pathlib import Path

import torch
from fastapi.testclient import TestClient

from agentlightning.semconv import HEADER_POLICY_VERSION
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.policy_server import create_policy_app
from agentlightning_trainer.torch_backend.policy import Policy


def _request(task: dict[str, str], **extra: object) -> dict[str, object]:
    return {"model": "tiny-gpt", "messages": tool_choice.messages(task), "max_tokens": 6, **extra}


def test_token_ids_logprobs_and_version_header(tool_spec: PolicySpec) -> None:
    policy = Policy.build(tool_spec, seed=0)
    with TestClient(create_policy_app(policy, version=3)) as client:
        task = tool_choice.tasks()[0]
        response = client.post("/v1/chat/completions", json=_request(task, return_token_ids=True, logprobs=True))
        assert response.status_code == 200, response.text
        assert response.headers[HEADER_POLICY_VERSION] == "3"
        body = response.json()
        assert body["prompt_token_ids"] == policy.tokenizer.encode_chat(tool_choice.messages(task))
        choice = body["choices"][0]
        assert 1 <= len(choice["token_ids"]) <= 6
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        assert all(item["logprob"] <= 0 for item in choice["logprobs"]["content"])
        assert choice["message"]["content"] == policy.tokenizer.decode(choice["token_ids"])
        plain = client.post("/v1/chat/completions", json=_request(task)).json()
        assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
        assert client.get("/v1/models").json()["data"][0]["policy_version"] == 3
        assert client.get("/health").json()["policy_version"] == 3


def test_greedy_is_deterministic_and_weights_hot_swap(tool_spec: PolicySpec, tmp_path: Path) -> None:
    policy = Policy.build(tool_spec, seed=0)
    other = Policy.build(tool_spec, seed=1)
    weights = tmp_path / "w.pt"
    torch.save(other.module.state_dict(), weights)
    tasks = tool_choice.tasks()
    with TestClient(create_policy_app(policy, version=0)) as client:

        def greedy() -> list[list[int]]:
            bodies = [_request(t, temperature=0, return_token_ids=True) for t in tasks]
            return [client.post("/v1/chat/completions", json=b).json()["choices"][0]["token_ids"] for b in bodies]

        before = greedy()
        assert greedy() == before
        swapped = client.post("/admin/weights", json={"path": str(weights), "version": 1})
        assert swapped.status_code == 200 and swapped.json() == {"policy_version": 1}
        after = greedy()
        assert after != before
        response = client.post("/v1/chat/completions", json=_request(tasks[0], temperature=0))
        assert response.headers[HEADER_POLICY_VERSION] == "1"
        missing = client.post("/admin/weights", json={"path": str(tmp_path / "nope.pt"), "version": 2})
        assert missing.status_code == 400 and "does not exist" in missing.json()["error"]["message"]


def test_stream_and_bad_requests(tool_spec: PolicySpec) -> None:
    policy = Policy.build(tool_spec, seed=0)
    with TestClient(create_policy_app(policy)) as client:
        task = tool_choice.tasks()[0]
        with client.stream(
            "POST", "/v1/chat/completions", json=_request(task, stream=True, return_token_ids=True)
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert '"prompt_token_ids"' in lines[0]
        empty = client.post("/v1/chat/completions", json={"model": "tiny-gpt", "messages": []})
        assert empty.status_code == 400 and "messages" in empty.json()["error"]["message"]
        too_long = client.post(
            "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
        )
        assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]
