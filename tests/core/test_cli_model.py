"""The model `agl dev`/`agl train` serve the agent (--upstream/--model, --fake), `agl fake-openai`, Trainer(llm=...).

The commands run as a user runs them: the real `agl` in a subprocess, in a directory holding the agent module.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from agentlightning import LLM, Trainer
from agentlightning.cli import app
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.testing import FakeOpenAI, FakeReply, FakeRequest, call_offered_tools

REPO = Path(__file__).resolve().parents[2]
AGL = [sys.executable, "-m", "agentlightning.cli"]
ENV = {**os.environ, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(REPO / "core"), "."])}

TOOL_AGENT = """
import json
from openai import OpenAI
from agentlightning import LLM, rollout

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit", "days"]}}}


@rollout
def agent(task: dict, llm: LLM) -> float:
    client = OpenAI(base_url=llm.base_url, api_key="unused")
    messages = [{"role": "user", "content": task["q"]}]
    first = client.chat.completions.create(model=llm.model, messages=messages, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    args = json.loads(call.function.arguments)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = client.chat.completions.create(model=llm.model, messages=messages, tools=[WEATHER])
    done = second.choices[0].message.content.startswith("echo:")
    return 1.0 if args == {"city": "test", "unit": "C", "days": 1} and done else 0.0
"""


def readme_agent() -> str:
    """The first Python block of the README's "Use it" section: the agent users save as my_agent.py."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use it") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def readme_dev_command() -> list[str]:
    """The README's offline `agl dev ... --fake` line, as written."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(row for row in readme.splitlines() if row.startswith("agl dev ") and row.endswith("--fake"))
    return line.split()[1:]


def agl(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real `agl` in ``cwd`` (stdout and stderr together)."""
    return subprocess.run([*AGL, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout, check=False)


def test_the_readme_agent_runs_with_the_readme_command(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(readme_agent(), encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"q": "Say 4", "a": "4"}\n{"q": "Say hi", "a": "bye"}\n')
    done = agl(readme_dev_command(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│ ro-")]
    assert len(rows) == 2, done.stdout
    # The fake echoes "Say 4": the first task finds its answer, the second cannot; each call is one transition.
    assert sorted(re.findall(r"│ (\d\.\d{4}) │", done.stdout)) == ["0.0000", "1.0000"]
    assert all("succeeded" in row and "1/1" in row for row in rows), done.stdout


def test_dev_serves_an_upstream_through_the_proxy_and_keeps_its_key(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(readme_agent(), encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"q": "Say 4", "a": "4"}\n')
    fake = FakeOpenAI(reply="the answer is 4")
    seen: list[str | None] = []
    original = fake.app

    async def recording(scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])  # type: ignore[arg-type]
            seen.append(headers.get(b"authorization", b"").decode() or None)
        await original(scope, receive, send)  # type: ignore[arg-type]

    fake.app = recording  # type: ignore[assignment]
    with fake.serve() as upstream:
        args = ["dev", "--agent", "my_agent:agent", "--tasks", "tasks.jsonl", "--store", "store.db"]
        done = subprocess.run(
            [*AGL, *args, "--upstream", upstream.base_url, "--model", "served-model"],
            cwd=tmp_path,
            env={**ENV, "AGL_UPSTREAM_API_KEY": "sk-secret-123"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1.0000" in done.stdout
    assert seen == ["Bearer sk-secret-123"]  # the proxy sent the key upstream, in place of the agent's "unused"
    assert b"sk-secret-123" not in (tmp_path / "store.db").read_bytes()

    async def inspect() -> tuple[LLM, dict[str, object]]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            snapshot = await store.get_resources()
            assert snapshot is not None
            rollouts = await store.query_rollouts()
            spans = await store.query_spans(rollouts[0].rollout_id, "latest")
            llm_span = next(s for s in spans if s.attributes.get("gen_ai.request.model"))
            llm = snapshot.resources["llm"]
            assert isinstance(llm, LLM)
            return llm, dict(llm_span.attributes)
        finally:
            await store.close()

    llm, attributes = asyncio.run(inspect())
    assert llm.proxied and llm.model == "served-model" and llm.api_key is None
    assert attributes["gen_ai.request.model"] == "served-model"


def test_dev_fake_tool_calls_answers_a_tool_agent_with_a_call_then_text(tmp_path: Path) -> None:
    (tmp_path / "tool_agent.py").write_text(TOOL_AGENT, encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"q": "Weather in Paris?"}\n')
    args = ["dev", "--agent", "tool_agent:agent", "--tasks", "tasks.jsonl", "--fake", "--fake-tool-calls"]
    done = agl(args, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1.0000" in done.stdout and "2/2" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--upstream", "http://127.0.0.1:9/v1"], "--upstream needs --model"),
        (["--fake", "--upstream", "http://127.0.0.1:9/v1", "--model", "m"], "not both"),
        (["--fake-tool-calls"], "add --fake"),
        (["--model", "m"], "--model names the model"),
        (["--upstream", "127.0.0.1:8000", "--model", "m"], "not an http(s):// URL"),
    ],
)
def test_dev_model_options_reject_bad_combinations(tmp_path: Path, args: list[str], complaint: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "x"}\n')
    result = CliRunner().invoke(
        app, ["dev", "--agent", "json:dumps", "--tasks", str(tasks), *args], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2, result.output
    assert complaint in result.output


def test_train_runner_role_refuses_to_serve_a_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--role", "runner", "--agent", "json:dumps", "--store", str(tmp_path / "s.db"), "--fake"],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert "runners read it from the store" in result.output


def test_train_with_fake_runs_the_baseline_with_the_model(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(readme_agent(), encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"q": "Say 4", "a": "4"}\n{"q": "Say 5", "a": "5"}\n')
    done = agl(["train", "--agent", "my_agent:agent", "--tasks", "tasks.jsonl", "--store", "s.db", "--fake"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    async def rewards() -> list[str]:
        store = SqliteLightningStore(tmp_path / "s.db")
        try:
            return [r.status for r in await store.query_rollouts()]
        finally:
            await store.close()

    assert asyncio.run(rewards()) == ["succeeded", "succeeded"]


def test_trainer_llm_belongs_to_the_algorithm_side() -> None:
    with pytest.raises(ValueError, match="runners read it from the store"):
        Trainer(role="runner", llm=LLM(base_url="http://127.0.0.1:9/v1", model="m"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_fake_openai_command_serves_tool_calls(tmp_path: Path) -> None:
    port = _free_port()
    server = subprocess.Popen(
        [*AGL, "fake-openai", "--port", str(port), "--tool-calls"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in banner
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "agl fake-openai did not start"
                time.sleep(0.1)
        tool = {"type": "function", "function": {"name": "add", "parameters": {"required": ["a"]}}}
        body = {"model": "x", "messages": [{"role": "user", "content": "1+1"}], "tools": [tool]}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=10).json()
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a":"test"}'}
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


def _request(body: dict[str, object], messages: list[dict[str, object]]) -> FakeRequest:
    return FakeRequest(endpoint="chat.completions", body=body, messages=messages)


def test_call_offered_tools_fills_required_arguments_by_type() -> None:
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": ["null", "number"]},
            "b": {"type": "boolean"},
            "a": {"type": "array"},
            "o": {"type": "object"},
            "e": {"enum": ["x", "y"]},
            "optional": {"type": "string"},
        },
        "required": ["s", "i", "n", "b", "a", "o", "e"],
    }
    user = [{"role": "user", "content": "go"}]
    chat = _request({"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}, user)
    reply = call_offered_tools(chat)
    assert [call.name for call in reply.tool_calls] == ["f"]
    expected = {"s": "test", "i": 1, "n": 1, "b": True, "a": [], "o": {}, "e": "x"}
    assert json.loads(reply.tool_calls[0].arguments) == expected
    # Responses API tools are flat; the first offered tool is the one called.
    flat = {"tools": [{"type": "function", "name": "g", "parameters": {}}, {"type": "function", "name": "h"}]}
    assert call_offered_tools(_request(flat, user)).tool_calls[0].name == "g"
    # Once a tool answered, or with no tools, the fake answers in text.
    answered = [*user, {"role": "assistant", "content": ""}, {"role": "tool", "content": "42"}]
    assert call_offered_tools(_request(chat.body, answered)) == FakeReply(text="echo: go")
    assert call_offered_tools(_request({}, user)) == FakeReply(text="echo: go")
