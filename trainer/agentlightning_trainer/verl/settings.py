# pyright: reportMissingImports=false
# (verl, hydra and omegaconf come with the optional [verl] extra, absent from the main environment pyright checks)
"""verl-only settings and the one mapping of our LightningRL config onto verl's Hydra config.

:func:`verl_overrides` is the single place where our settings become verl keys; :func:`compose_verl_config`
applies them to verl's own defaults (``verl/trainer/config/ppo_trainer.yaml``), so every key we do not set keeps
verl's default. Multi-GPU and multi-node runs differ only in :class:`VerlSettings` (``n_gpus_per_node``,
``nnodes``, ``tensor_parallel_size``), never in code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentlightning_trainer.config import LightningRLConfig

AttnImplementation = Literal["auto", "flash_attention_2", "sdpa", "eager"]


class VerlSettings(BaseModel):
    """What only the verl backend needs: the cluster shape, memory split and engine switches."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_gpus_per_node: int = Field(default=1, ge=1, description="GPUs per node (trainer.n_gpus_per_node).")
    nnodes: int = Field(default=1, ge=1, description="Nodes in the Ray cluster (trainer.nnodes).")
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="vLLM tensor parallelism per replica; replicas = GPUs / this."
    )
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Share of GPU memory vLLM may take; the actor shares the GPU (it sleeps during updates).",
    )
    max_tokens_per_gpu: int = Field(
        default=16384, ge=256, description="Token budget of one micro-batch per GPU (dynamic batch size)."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="vLLM's context length; None = the model's own (multi-turn agents)."
    )
    enforce_eager: bool = Field(
        default=False, description="Skip vLLM's CUDA-graph capture: faster start, slower sampling (smoke tests)."
    )
    param_offload: bool = Field(default=False, description="Offload FSDP parameters to CPU (large models).")
    optimizer_offload: bool = Field(default=False, description="Offload optimizer state to CPU (large models).")
    gradient_checkpointing: bool = Field(default=True, description="Recompute activations in backward (memory).")
    attn_implementation: AttnImplementation = Field(
        default="auto", description="HF attention kernel; 'auto' = flash_attention_2 if flash-attn imports, else sdpa."
    )
    ray_address: str | None = Field(
        default=None,
        description="Ray cluster to join ('auto' = the running one, or ray://host:10001); None = RAY_ADDRESS or a "
        "new local cluster.",
    )
    proxy_host: str = Field(
        default="127.0.0.1",
        description="Where the LLM proxy listens; '0.0.0.0' when runners on other machines call it (agl runner).",
    )
    project_name: str = Field(default="agentlightning", description="verl's trainer.project_name (loggers).")
    experiment_name: str = Field(default="lightning-rl", description="verl's trainer.experiment_name (loggers).")
    loggers: tuple[str, ...] = Field(default=("console",), description="verl's trainer.logger backends.")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra verl keys (dotted path -> value), applied last: the escape hatch for anything else.",
    )

    @model_validator(mode="after")
    def _check(self) -> VerlSettings:
        gpus = self.n_gpus_per_node * self.nnodes
        if gpus % self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} must divide the {gpus} GPUs "
                f"(n_gpus_per_node {self.n_gpus_per_node} x nnodes {self.nnodes})"
            )
        return self


def flash_attn_available() -> bool:
    """True when the flash-attn package is importable (verl's default attention kernel needs it)."""
    return importlib.util.find_spec("flash_attn") is not None


def check_verl_config(config: LightningRLConfig) -> str:
    """The model path to train, after checking that ``config`` is one the verl backend runs; else a teaching error."""
    if config.algorithm != "grpo":
        raise ValueError(
            f"backend 'verl' runs GRPO with our rollout-level advantages; algorithm {config.algorithm!r} needs "
            "backend='torch'"
        )
    if config.policy.kind != "hf" or not config.policy.hf_model:
        raise ValueError(
            "backend 'verl' trains a Hugging Face model: set policy=PolicySpec(kind='hf', hf_model='Qwen/Qwen2.5-0.5B-"
            "Instruct' or a local path, model_name=<the name your agent sends>)"
        )
    if config.checkpoint_dir is not None:
        raise ValueError(
            "backend 'verl' does not write LightningRL checkpoints (checkpoint_dir is set); save the model with "
            "verl's trainer.save_freq through VerlSettings.overrides, or use backend='torch'"
        )
    if config.init_weights is not None:
        raise ValueError(
            "backend 'verl' starts from policy.hf_model, not from a torch state dict (init_weights is set); save "
            "the fine-tuned model with save_pretrained and point hf_model at that directory"
        )
    if config.tis_cap is not None:
        # verl has the correction (algorithm.rollout_correction) but applies it inside RayPPOTrainer.fit, the loop
        # our engine's train step replaces; setting verl's keys alone would silently train without it.
        raise ValueError(
            "tis_cap (truncated importance sampling) is not wired into the verl backend yet; use backend='torch' "
            "for it, or tis_cap=None"
        )
    if config.entropy_coef > 0 and config.loss_aggregation == "rollout-mean":
        raise ValueError(
            "backend 'verl' reaches loss_aggregation='rollout-mean' by scaling advantages, which does not reach the "
            "entropy bonus (verl would aggregate it token-mean); use loss_aggregation='token-mean' with "
            "entropy_coef > 0, or backend='torch'"
        )
    return config.policy.hf_model


def verl_overrides(config: LightningRLConfig, settings: VerlSettings) -> dict[str, Any]:
    """Our config → verl's config keys (dotted path → value); the one mapping between the two."""
    model_path = check_verl_config(config)
    attn = settings.attn_implementation
    if attn == "auto":
        attn = "flash_attention_2" if flash_attn_available() else "sdpa"
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    overrides: dict[str, Any] = {
        # GRPO; our rollout-level advantages replace verl's per-row ones (see batch.py), these keep metrics honest.
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": config.normalize_std,
        "algorithm.use_kl_in_reward": False,
        "data.train_batch_size": config.tasks_per_step,
        "data.max_prompt_length": config.max_prompt_tokens,
        "data.max_response_length": config.max_response_tokens,
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": settings.gradient_checkpointing,
        "actor_rollout_ref.model.override_config.attn_implementation": attn,
        f"{actor}.optim.lr": config.lr,
        f"{actor}.optim.weight_decay": config.weight_decay,
        f"{actor}.optim.clip_grad": config.max_grad_norm,
        f"{actor}.grad_clip": config.max_grad_norm,
        f"{actor}.clip_ratio_low": config.clip_ratio,
        f"{actor}.clip_ratio_high": config.clip_high,
        # Always token-mean in verl: rollout-mean is reached by scaling advantages (batch.token_advantage_scales).
        f"{actor}.loss_agg_mode": "token-mean",
        f"{actor}.ppo_epochs": config.epochs,
        f"{actor}.ppo_mini_batch_size": config.tasks_per_step,
        f"{actor}.use_dynamic_bsz": True,
        f"{actor}.ppo_max_token_len_per_gpu": settings.max_tokens_per_gpu,
        f"{actor}.use_kl_loss": config.kl_coef > 0,
        f"{actor}.kl_loss_coef": config.kl_coef,
        f"{actor}.kl_loss_type": "low_var_kl",  # k3, the estimator of our torch backend
        f"{actor}.entropy_coeff": config.entropy_coef,
        f"{actor}.shuffle": False,
        f"{actor}.data_loader_seed": config.seed,
        f"{actor}.fsdp_config.param_offload": settings.param_offload,
        f"{actor}.fsdp_config.optimizer_offload": settings.optimizer_offload,
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,  # only built when kl_coef > 0; idle between steps
        f"{rollout}.name": "vllm",
        f"{rollout}.mode": "async",
        f"{rollout}.n": config.samples_per_task,
        f"{rollout}.temperature": config.temperature,
        f"{rollout}.seed": config.seed,
        f"{rollout}.tensor_model_parallel_size": settings.tensor_parallel_size,
        f"{rollout}.gpu_memory_utilization": settings.gpu_memory_utilization,
        f"{rollout}.max_model_len": settings.max_model_len,
        f"{rollout}.enforce_eager": settings.enforce_eager,
        f"{rollout}.calculate_log_probs": True,
        f"{rollout}.checkpoint_engine.backend": "naive",  # colocated: weights go to vLLM over CUDA IPC
        # verl's own agent-loop and reward workers sit idle (our runners run the agents): keep one of each.
        f"{rollout}.agent.num_workers": 1,
        "reward.num_workers": 1,
        "reward.reward_model.enable": False,
        "critic.enable": False,  # GRPO has no value model (and verl warns when this is left unset)
        "trainer.use_v1": False,  # the RayPPOTrainer path (verl.trainer.main_ppo_v0), see trainer.py
        "trainer.n_gpus_per_node": settings.n_gpus_per_node,
        "trainer.nnodes": settings.nnodes,
        "trainer.total_training_steps": config.steps,
        "trainer.total_epochs": 1,
        "trainer.project_name": settings.project_name,
        "trainer.experiment_name": settings.experiment_name,
        "trainer.logger": list(settings.loggers),
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.balance_batch": True,
        "trainer.device": "cuda",
    }
    if config.clip_ratio_c is not None:  # None keeps verl's own dual clip (3.0): verl has no way to turn it off
        overrides[f"{actor}.clip_ratio_c"] = config.clip_ratio_c
    overrides.update(settings.overrides)
    return overrides


def compose_verl_config(config: LightningRLConfig, settings: VerlSettings) -> Any:
    """verl's full ``DictConfig``: its ``ppo_trainer`` defaults with :func:`verl_overrides` applied on top."""
    import verl.trainer.config as verl_config_package
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = verl_overrides(config, settings)
    config_dir = str(Path(str(verl_config_package.__file__)).parent)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        composed = compose(config_name="ppo_trainer")
    for key, value in overrides.items():
        # force_add: some keys (override_config.attn_implementation) are not in verl's struct-mode defaults
        OmegaConf.update(composed, key, value, merge=False, force_add=True)
    return composed
