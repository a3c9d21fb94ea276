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


# Hides the server extra's packages from the import system, as on a machine that installed only agentlightning-core.
WITHOUT_SERVER_EXTRA = """
import importlib.abc, json, sys

class HideServerExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "prometheus_client", "starlette") or name.startswith(
            "google.protobuf"
        ):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideServerExtra())
if sys.argv[1:]:  # run `agl` with these arguments instead
    from agentlightning.cli import main
    sys.argv = ["agl", *sys.argv[1:]]
    main()
import agentlightning
from agentlightning.client import LightningStoreClient
from agentlightning.store import SqliteLightningStore
from agentlightning.runner import Runner
from agentlightning.tracing import LightningTracer
errors = {}
for module in ("agentlightning.server", "agentlightning.proxy", "agentlightning.dashboard", "agentlightning.testing"):
    try:
        __import__(module)
    except ImportError as exc:
        errors[module] = [type(exc).__name__, str(exc)]
try:
    from agentlightning.otel import spans_from_otlp
    spans_from_otlp(b"")
except ImportError as exc:
    errors["spans_from_otlp"] = [type(exc).__name__, str(exc)]
print(json.dumps(errors))
"""


def test_core_without_server_extra_traces_and_names_the_extra() -> None:
    """The client, stores, runner and tracer work without the server extra; its features say how to install it."""
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVER_EXTRA], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(errors) == sorted(
        [
            "agentlightning.server",
            "agentlightning.proxy",
            "agentlightning.dashboard",
            "agentlightning.testing",
            "spans_from_otlp",
        ]
    )
    for kind, message in errors.values():
        assert kind == "MissingExtraError"
        assert 'pip install "agentlightning-core[server]"' in message


def test_agl_server_command_without_server_extra_says_what_to_install() -> None:
    """``agl store`` on a core-only install exits 1 with the install command, not a traceback."""
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVER_EXTRA, "store", "--backend", "memory", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("agl: the store server")
    assert 'pip install "agentlightning-core[server]"' in result.stderr
    assert "Traceback" not in result.stderr
