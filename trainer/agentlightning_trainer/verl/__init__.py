"""The verl backend of LightningRL: GPU training with verl 0.9.1, rollouts served by its vLLM replicas.

Install with ``pip install "agentlightning-trainer[verl]"`` (verl 0.9.1 pins vllm 0.24.0, torch 2.11.0,
transformers 5.9.0; see docs/verl.md). Public names load lazily so that importing this package never imports verl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlightning_trainer._lazy_exports import lazy_getattr

_EXPORTS: dict[str, str] = {
    "VerlLightningRL": "agentlightning_trainer.verl.algorithm",
    "run_verl": "agentlightning_trainer.verl.algorithm",
    "VerlSettings": "agentlightning_trainer.verl.settings",
    "verl_overrides": "agentlightning_trainer.verl.settings",
    "compose_verl_config": "agentlightning_trainer.verl.settings",
    "transitions_to_batch": "agentlightning_trainer.verl.batch",
    "build_batch_tensors": "agentlightning_trainer.verl.batch",
    "VerlEngine": "agentlightning_trainer.verl.engine",
    "ReplicaRouter": "agentlightning_trainer.verl.router",
    "algorithm_from_cli": "agentlightning_trainer.verl.launch",
}

__all__ = [
    "ReplicaRouter",
    "VerlEngine",
    "VerlLightningRL",
    "VerlSettings",
    "algorithm_from_cli",
    "build_batch_tensors",
    "compose_verl_config",
    "run_verl",
    "transitions_to_batch",
    "verl_overrides",
]


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:
    from agentlightning_trainer.verl.algorithm import VerlLightningRL, run_verl
    from agentlightning_trainer.verl.batch import build_batch_tensors, transitions_to_batch
    from agentlightning_trainer.verl.engine import VerlEngine
    from agentlightning_trainer.verl.launch import algorithm_from_cli
    from agentlightning_trainer.verl.router import ReplicaRouter
    from agentlightning_trainer.verl.settings import VerlSettings, compose_verl_config, verl_overrides
