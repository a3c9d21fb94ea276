# pyright: reportMissingImports=false
# (verl, hydra and omegaconf come with the optional [verl] extra, absent from the main environment pyright checks)
"""verl's workers behind a small typed surface: start the actor and vLLM replicas, train on a batch, push weights.

We drive verl 0.9.1's ``RayPPOTrainer`` (the ``trainer.use_v1=False`` path, worker wiring as in
``verl.trainer.main_ppo_v0.TaskRunner``) without its dataloader or rollout step: tasks come from our store and
rollouts from the user's agents through our proxy. Per step, after the rollouts: put the vLLM replicas to sleep
(free their GPU memory for the update), recompute old log-probs, run verl's actor update on our batch, then push the
new weights into the replicas over CUDA IPC (``CheckpointEngineManager.update_weights``), which wakes them.
Every call here blocks; the algorithm runs them in a worker thread.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from typing import Any

import ray
import torch
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import need_critic, need_reference_policy

from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig
from agentlightning_trainer.verl.batch import transitions_to_batch
from agentlightning_trainer.verl.settings import VerlSettings, compose_verl_config

logger = logging.getLogger(__name__)


class LightningPPOTrainer(RayPPOTrainer):
    """verl's trainer without datasets: our algorithm feeds it batches built from the agents' transitions."""

    def _create_dataloader(self, *args: Any, **kwargs: Any) -> None:
        """Tasks come from the store, not from parquet files; only the step count verl's schedulers need is set."""
        self.train_dataset = self.val_dataset = None
        self.total_training_steps = int(self.config.trainer.total_training_steps)
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = self.total_training_steps


def _actor_param_checksum(worker: Any) -> float:
    """Sum of the actor's parameters on this worker (its FSDP shard), run inside the Ray actor."""
    inner = next(iter(worker.worker_dict.values())) if hasattr(worker, "worker_dict") else worker
    module = inner.actor.engine.module
    total = 0.0
    with torch.no_grad():
        for param in module.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            total += float(local.detach().to(torch.float64).sum().item())
    return total


class VerlEngine:
    """The actor (FSDP), the colocated vLLM replicas and the weight sync between them."""

    def __init__(self, config: LightningRLConfig, settings: VerlSettings) -> None:
        """Compose verl's config now (cheap, validates the mapping); nothing starts until :meth:`start`."""
        self.config = config
        self.settings = settings
        self.verl_config: Any = compose_verl_config(config, settings)
        self.trainer: Any = None
        self.started_ray = False
        self.pad_token_id = 0
        self.dp_size = 1
        self.tokenizer: Any = None
        """The model's HF tokenizer (verl's, the one vLLM serves with), once :meth:`start` has run."""

    def connect(self) -> None:
        """Join the Ray cluster (``ray_address``, else RAY_ADDRESS) or start a local one; call on the main thread."""
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

        if not ray.is_initialized():
            ray.init(address=self.settings.ray_address, runtime_env=get_ppo_ray_runtime_env(self.verl_config))
            self.started_ray = True

    def start(self) -> None:
        """Build the workers and replicas and load the initial weights into the replicas (minutes; blocking)."""
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        cfg = self.verl_config
        self.connect()
        OmegaConf.resolve(cfg)
        wiring = BaseTaskRunner()
        _, worker_group_cls = wiring.add_actor_rollout_worker(cfg)
        wiring.add_critic_worker(cfg)
        wiring.add_reward_model_resource_pool(cfg)
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
        tokenizer = self.tokenizer = model_config.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad or 0)
        self.trainer = LightningPPOTrainer(
            config=cfg,
            tokenizer=tokenizer,
            processor=model_config.processor,
            role_worker_mapping=wiring.role_worker_mapping,
            resource_pool_manager=wiring.init_resource_pool_mgr(cfg),
            ray_worker_group_cls=worker_group_cls,
        )
        self.trainer.init_workers()
        self.dp_size = int(self.trainer._get_dp_size(self.trainer.actor_rollout_wg, "actor"))
        # vLLM starts on dummy weights (rollout.load_format=dummy): the first sync loads the real ones and wakes it.
        self.trainer.checkpoint_manager.update_weights(0)

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of each vLLM replica's OpenAI-compatible server."""
        return list(self.trainer.llm_server_manager.get_addresses())

    @property
    def served_model(self) -> str:
        """The model name vLLM serves (verl launches ``vllm serve <local model path>``)."""
        return str(self.trainer.llm_server_manager.get_replicas()[0].model_config.local_path)

    def mini_batch_rows(self, rows: int) -> tuple[int, int]:
        """(rows after padding, rows per mini-batch): both multiples of the data-parallel size."""
        dp = self.dp_size
        if self.config.mini_batch_size is None:
            padded = math.ceil(rows / dp) * dp
            return padded, padded
        mini = math.ceil(self.config.mini_batch_size / dp) * dp
        return math.ceil(rows / mini) * mini, mini

    def train_step(self, transitions: Sequence[Transition], step: int) -> dict[str, float]:
        """One actor update on ``transitions`` (advantages set), then the new weights go to the replicas."""
        trainer = self.trainer
        trainer.checkpoint_manager.sleep_replicas()
        padded, mini = self.mini_batch_rows(len(transitions))
        batch: Any = transitions_to_batch(
            transitions,
            pad_token_id=self.pad_token_id,
            loss_aggregation=self.config.loss_aggregation,
            size_multiple=padded if self.config.mini_batch_size is None else mini,
            temperature=self.config.temperature,
        )
        metrics: dict[str, Any] = {}
        if self.verl_config.trainer.balance_batch:
            trainer._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        old_log_prob, _ = trainer._compute_old_log_prob(batch)
        old_log_prob.batch.pop("entropys")
        batch = batch.union(old_log_prob)
        if trainer.use_reference_policy:
            batch = batch.union(trainer._compute_ref_log_prob(batch))
        metrics.update(self._update_actor(batch, mini))
        trainer.checkpoint_manager.update_weights(step)
        # numbers.Real: verl's reductions return numpy scalars (np.float32 is no Python float)
        return {key: float(value) for key, value in metrics.items() if isinstance(value, numbers.Real)}

    def _update_actor(self, batch: Any, mini_batch_rows: int) -> dict[str, Any]:
        """verl's ``RayPPOTrainer._update_actor`` with our mini-batch size (rows vary per step with the agents)."""
        from verl.utils import tensordict_utils as tu
        from verl.utils.metric import reduce_metrics
        from verl.workers.utils.padding import left_right_2_no_padding

        cfg = self.verl_config
        actor = cfg.actor_rollout_ref.actor
        batch.meta_info["multi_turn"] = cfg.actor_rollout_ref.rollout.multi_turn.enable
        batch.meta_info["temperature"] = self.config.temperature
        batch_td = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(
            batch_td,
            calculate_entropy=bool(actor.calculate_entropy or actor.entropy_coeff != 0.0),
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=mini_batch_rows,
            mini_batch_size=mini_batch_rows,
            epochs=actor.ppo_epochs,
            seed=actor.data_loader_seed,
            dataloader_kwargs={"shuffle": actor.shuffle},
            compute_loss=True,
        )
        output = self.trainer.actor_rollout_wg.update_actor(batch_td)
        raw = dict(tu.get(output, "metrics"))
        raw.pop("mfu", None)
        return {f"actor/{key}": value for key, value in reduce_metrics(raw).items()}

    def actor_checksum(self) -> float:
        """Sum of the actor's parameters on rank 0 (its shard when FSDP shards over several GPUs)."""
        worker = self.trainer.actor_rollout_wg.workers[0]
        return float(ray.get(worker.__ray_call__.remote(_actor_param_checksum)))

    def stop(self) -> None:
        """Release the replicas and workers; shut Ray down if we started it."""
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
        self.trainer = None
