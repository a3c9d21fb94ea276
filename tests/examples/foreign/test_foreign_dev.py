"""The foreign example's agent knows nothing of Agent Lightning, and its OpenInference spans reach the store's
rollouts through the stock OTLP exporter, filed by the resource attributes its launcher sets."""

from __future__ import annotations

import ast
import asyncio
import io
from pathlib import Path

from rich.console import Console

from examples.foreign.train import dev_async

AGENT = Path(__file__).resolve().parents[3] / "examples" / "foreign" / "agent.py"


def test_the_agent_imports_no_agent_lightning() -> None:
    tree = ast.parse(AGENT.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("agentlightning") or name.startswith("examples") for name in imported), imported
    assert "openinference.instrumentation.openai" in imported
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in imported


def test_dev_mode_files_the_openinference_span_under_each_rollout() -> None:
    out = io.StringIO()
    rows, trees = asyncio.run(dev_async(n_tasks=2, console=Console(file=out, width=200)))
    assert [r.status for r in rows] == ["succeeded", "succeeded"]
    assert all(r.final_reward == 1.0 for r in rows)  # the fake upstream names each ticket's team
    # One call per rollout, recorded by OpenInference alone: no token ids until the trainer re-tokenises it.
    assert all(r.transitions == 1 and r.transitions_with_token_ids == 0 for r in rows)
    printed = out.getvalue()
    assert len(trees) == 2
    assert printed.count("ChatCompletion (otlp)") == 2 and "(proxy)" not in printed
