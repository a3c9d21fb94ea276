"""``agl train --backend torch|verl --config run.yaml``: settings files → the LightningRL algorithm."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlightning.cli import app
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.verl.launch import algorithm_from_cli, load_settings_file

needs_verl = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None,
    reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)",
)

RUN_YAML = """
steps: 3
tasks_per_step: 4
samples_per_task: 4
lr: 1.0e-6
max_prompt_tokens: 512
max_response_tokens: 64
policy: {kind: hf, hf_model: /models/qwen, model_name: policy}
verl: {n_gpus_per_node: 8, nnodes: 2, ray_address: auto, enforce_eager: true}
"""


def test_torch_backend_from_json(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"steps": 5, "samples_per_task": 16}), encoding="utf-8")
    algorithm = algorithm_from_cli("torch", path)
    assert isinstance(algorithm, LightningRL)
    assert algorithm.config.steps == 5 and algorithm.config.backend == "torch"


@needs_verl
def test_verl_backend_from_yaml(tmp_path: Path) -> None:
    from agentlightning_trainer.verl.algorithm import VerlLightningRL

    path = tmp_path / "run.yaml"
    path.write_text(RUN_YAML, encoding="utf-8")
    algorithm = algorithm_from_cli("verl", path)
    assert isinstance(algorithm, VerlLightningRL)
    assert algorithm.config.backend == "verl" and algorithm.config.policy.hf_model == "/models/qwen"
    assert algorithm.verl_settings.n_gpus_per_node == 8 and algorithm.verl_settings.nnodes == 2
    assert algorithm.verl_settings.ray_address == "auto" and algorithm.verl_settings.enforce_eager


def test_bad_settings_files_teach(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no settings file"):
        load_settings_file(tmp_path / "missing.json")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_settings_file(listed)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"verl": {"nnodes": 2}}), encoding="utf-8")
    with pytest.raises(ValueError, match="pass --backend verl"):
        algorithm_from_cli("torch", mixed)
    with pytest.raises(ValueError, match="unknown backend"):
        algorithm_from_cli("jax")


def test_agl_train_refuses_backend_with_algorithm(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n', encoding="utf-8")
    result = CliRunner().invoke(
        app,
        ["train", "--role", "algorithm", "--tasks", str(tasks), "--backend", "torch", "--algorithm", "m:a"],
    )
    assert result.exit_code == 2
    assert "not both" in result.output


@needs_verl
def test_agl_train_reports_a_config_verl_cannot_run(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n', encoding="utf-8")
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"algorithm": "ppo", "policy": {"kind": "hf", "hf_model": "m"}}), encoding="utf-8")
    result = CliRunner().invoke(
        app, ["train", "--role", "algorithm", "--tasks", str(tasks), "--backend", "verl", "--config", str(config)]
    )
    assert result.exit_code == 2
    assert "backend='torch'" in result.output
