"""The GPU smoke entry on CPU: its task, its reward, argument parsing and the dry run (verl's composed config)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from agentlightning_trainer.verl import smoke

ROOT = Path(__file__).resolve().parents[3]
needs_verl = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None,
    reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)",
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}', encoding="utf-8")
    return tmp_path


def test_reward_prefers_the_right_terse_answer() -> None:
    task = {"a": 12, "b": 34}
    assert smoke.score(task, "408") == pytest.approx(1 - 0.003)
    assert smoke.score(task, "The answer is 408.") < smoke.score(task, "408")
    assert smoke.score(task, "409") == pytest.approx(-0.003)
    assert smoke.score(task, "") == 0.0
    assert smoke.make_tasks(3, 0) == smoke.make_tasks(3, 0)
    assert all(12 <= t["a"] <= 99 and 12 <= t["b"] <= 99 for t in smoke.make_tasks(20, 1))


@needs_verl
def test_settings_fit_one_gpu(model_dir: Path) -> None:
    import argparse

    args = argparse.Namespace(
        model_path=model_dir, steps=2, tasks_per_step=4, samples_per_task=4, max_response_tokens=16, lr=1e-5,
        gpu_memory_utilization=0.4, seed=0,
    )  # fmt: skip
    config, settings = smoke.build(args)
    assert config.backend == "verl" and config.steps == 2 and config.policy.hf_model == str(model_dir)
    assert settings.n_gpus_per_node == 1 and settings.nnodes == 1 and settings.enforce_eager


def test_a_folder_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no config\.json"):
        smoke.main([str(tmp_path), "--dry-run"])


@needs_verl
def test_dry_run_composes_verls_config(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert smoke.main([str(model_dir), "--dry-run", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "dry run ok: 3 steps x 4 tasks x 4 samples" in out
    assert '"trainer.n_gpus_per_node": 1' in out


def test_shell_script_checks_its_argument(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "gpu_smoke.sh"
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "MODEL_PATH" in usage.stdout
    missing = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "no config.json" in missing.stderr
