"""``import agentlightning`` (and its lazy data-model names) pulls in no agent framework, torch or verl."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = (
    "langchain",
    "langchain_core",
    "langgraph",
    "autogen",
    "autogen_agentchat",
    "autogen_core",
    "agents",
    "crewai",
    "torch",
    "verl",
    "vllm",
    "transformers",
)

SCRIPT = """
import json, sys
import agentlightning
from agentlightning import Span, Rollout, Attempt, RolloutConfig, LLM, PromptTemplate, ResourcesSnapshot, Transition
from agentlightning import emit_reward, rollout_context, get_tracer
import agentlightning.otel, agentlightning.tracing, agentlightning.emit, agentlightning.semconv
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_import_pulls_in_no_framework() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert "agentlightning" in loaded and "pydantic" in loaded
    assert loaded.isdisjoint(FORBIDDEN), sorted(loaded.intersection(FORBIDDEN))
