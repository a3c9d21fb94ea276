"""verl's trainer wired from our config, as far as a CPU goes: construction (no workers) and batch sizing."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)")

from omegaconf import OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.verl.engine import LightningPPOTrainer, VerlEngine
from agentlightning_trainer.verl.settings import VerlSettings


def _config(**fields: object) -> LightningRLConfig:
    base: dict[str, object] = {
        "backend": "verl",
        "policy": PolicySpec(kind="hf", hf_model="/models/qwen", model_name="policy"),
        "steps": 7,
        "tasks_per_step": 4,
        "samples_per_task": 4,
        "max_prompt_tokens": 256,
        "max_response_tokens": 16,
    }
    return LightningRLConfig.model_validate({**base, **fields})


def test_trainer_builds_without_datasets() -> None:
    engine = VerlEngine(_config(), VerlSettings())
    cfg = engine.verl_config
    OmegaConf.resolve(cfg)
    wiring = BaseTaskRunner()
    _, worker_group_cls = wiring.add_actor_rollout_worker(cfg)
    wiring.add_critic_worker(cfg)
    wiring.add_reward_model_resource_pool(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    # verl marks the legacy RayPPOTrainer deprecated; it is the one whose rollout step can be replaced (main_ppo_v0)
    with pytest.warns(FutureWarning, match="RayPPOTrainer"):
        trainer = LightningPPOTrainer(
            config=cfg,
            tokenizer=None,
            processor=None,
            role_worker_mapping=wiring.role_worker_mapping,
            resource_pool_manager=wiring.init_resource_pool_mgr(cfg),
            ray_worker_group_cls=worker_group_cls,
        )
    assert trainer.total_training_steps == 7
    assert cfg.actor_rollout_ref.actor.optim.total_training_steps == 7
    assert trainer.hybrid_engine and not trainer.use_critic and not trainer.use_reference_policy


@pytest.mark.parametrize(
    ("mini_batch_size", "dp", "rows", "expected"),
    [
        (None, 1, 7, (7, 7)),  # one mini-batch holds the step
        (None, 2, 7, (8, 8)),  # one filler row so both ranks get 4
        (3, 2, 7, (8, 4)),  # mini-batches rounded up to the DP size, the step to whole mini-batches
        (4, 4, 9, (12, 4)),
    ],
)
def test_batches_divide_across_ranks_and_mini_batches(
    mini_batch_size: int | None, dp: int, rows: int, expected: tuple[int, int]
) -> None:
    engine = VerlEngine(_config(mini_batch_size=mini_batch_size), VerlSettings())
    engine.dp_size = dp
    assert engine.mini_batch_rows(rows) == expected
