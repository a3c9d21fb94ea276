"""Our config → verl's config: the mapping lands on verl's keys and passes verl's own validation."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is not installed: the verl suite runs in .venv-verl (requirements-verl.txt)")

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.verl.settings import (
    VerlSettings,
    check_verl_config,
    compose_verl_config,
    flash_attn_available,
    verl_overrides,
)

QWEN = PolicySpec(kind="hf", hf_model="Qwen/Qwen2.5-0.5B-Instruct", model_name="policy")


def _config(**fields: object) -> LightningRLConfig:
    base: dict[str, object] = {
        "backend": "verl",
        "policy": QWEN,
        "steps": 20,
        "tasks_per_step": 8,
        "samples_per_task": 4,
        "lr": 1e-6,
        "max_prompt_tokens": 1024,
        "max_response_tokens": 256,
    }
    return LightningRLConfig.model_validate({**base, **fields})


@pytest.fixture(scope="module")
def composed() -> DictConfig:
    return compose_verl_config(_config(kl_coef=0.01, clip_ratio_high=0.28), VerlSettings())


def test_fields_land_on_verls_keys(composed: DictConfig) -> None:
    arr = composed.actor_rollout_ref
    assert arr.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert arr.actor.optim.lr == 1e-6
    assert arr.actor.clip_ratio_low == 0.2 and arr.actor.clip_ratio_high == 0.28
    assert arr.actor.loss_agg_mode == "token-mean"
    assert arr.actor.use_kl_loss is True and arr.actor.kl_loss_coef == 0.01 and arr.actor.kl_loss_type == "low_var_kl"
    assert arr.rollout.name == "vllm" and arr.rollout.n == 4 and arr.rollout.temperature == 1.0
    assert composed.data.train_batch_size == 8
    assert composed.data.max_prompt_length == 1024 and composed.data.max_response_length == 256
    # verl's own interpolations follow our values
    assert arr.rollout.prompt_length == 1024 and arr.rollout.response_length == 256
    assert composed.algorithm.adv_estimator == "grpo"
    assert composed.trainer.n_gpus_per_node == 1 and composed.trainer.nnodes == 1
    assert composed.trainer.use_v1 is False
    assert composed.trainer.total_training_steps == 20


def _resolved(cfg: DictConfig) -> DictConfig:
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert isinstance(resolved, DictConfig)
    return resolved


def test_one_gpu_config_passes_verls_validation(composed: DictConfig) -> None:
    cfg = _resolved(composed)
    assert need_reference_policy(cfg) is True  # kl_coef > 0
    assert need_critic(cfg) is False
    validate_config(config=cfg, use_reference_policy=True, use_critic=False)


def test_multi_gpu_and_multi_node_are_settings_only() -> None:
    settings = VerlSettings(n_gpus_per_node=8, nnodes=4, tensor_parallel_size=2, ray_address="auto")
    cfg = compose_verl_config(_config(tasks_per_step=64, samples_per_task=16), settings)
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.trainer.nnodes == 4
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    validate_config(config=_resolved(cfg), use_reference_policy=False, use_critic=False)


def test_attention_kernel_follows_flash_attn() -> None:
    auto = verl_overrides(_config(), VerlSettings())
    expected = "flash_attention_2" if flash_attn_available() else "sdpa"
    assert auto["actor_rollout_ref.model.override_config.attn_implementation"] == expected
    forced = verl_overrides(_config(), VerlSettings(attn_implementation="sdpa"))
    assert forced["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"


def test_overrides_win_and_reach_the_composed_config() -> None:
    settings = VerlSettings(overrides={"actor_rollout_ref.rollout.max_num_seqs": 64, "trainer.save_freq": 10})
    cfg = compose_verl_config(_config(), settings)
    assert cfg.actor_rollout_ref.rollout.max_num_seqs == 64
    assert cfg.trainer.save_freq == 10


def test_configs_verl_cannot_run_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="backend='torch'"):
        check_verl_config(_config(algorithm="ppo"))
    with pytest.raises(ValueError, match="kind='hf'"):
        check_verl_config(_config(policy=PolicySpec(), max_prompt_tokens=100, max_response_tokens=8))
    with pytest.raises(ValueError, match="save_freq"):
        check_verl_config(_config(checkpoint_dir=Path("ckpt")))
    with pytest.raises(ValueError, match="save_pretrained"):
        check_verl_config(_config().model_copy(update={"init_weights": Path("sft/weights.pt")}))


def test_tensor_parallel_must_divide_the_gpus() -> None:
    with pytest.raises(ValidationError, match="must divide the 3 GPUs"):
        VerlSettings(n_gpus_per_node=3, tensor_parallel_size=2)
