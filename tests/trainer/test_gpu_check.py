"""The GPU check's code path, rehearsed on the CPU with a tiny model (the GPU run itself needs a GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")


def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentlightning_trainer.gpu_check import main

    assert main(["--size", "tiny", "--device", "cpu", "--steps", "2", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert report["params_on"] == ["cpu"] and report["server_device"] == "cpu"
    assert report["steps_trained"] == 2 and report["generation_tokens_per_s"] > 0
    assert report["trainable"] < report["parameters"]  # LoRA: only adapters train
    assert "gpu_check: OK" in out
