"""Agent Lightning trainers: LightningRL (GRPO/PPO) on a torch backend with a policy server; APO; SFT.

Public names load lazily, so ``import agentlightning_trainer`` (done by core's integration discovery) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlightning_trainer._lazy_exports import lazy_getattr

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "LightningRL": "agentlightning_trainer.lightning_rl",
    "LightningRLConfig": "agentlightning_trainer.config",
    "PolicySpec": "agentlightning_trainer.config",
    "Policy": "agentlightning_trainer.torch_backend.policy",
    "TorchLearner": "agentlightning_trainer.torch_backend.learner",
    "PolicyServerProcess": "agentlightning_trainer.policy_process",
    "create_policy_app": "agentlightning_trainer.policy_server",
    "train_in_process": "agentlightning_trainer.inprocess",
    "evaluate_greedy": "agentlightning_trainer.inprocess",
    "MetricsLogger": "agentlightning_trainer.metrics",
    "StepMetrics": "agentlightning_trainer.metrics",
    "plot_reward_curve": "agentlightning_trainer.plotting",
    "APO": "agentlightning_trainer.apo",
    "APOConfig": "agentlightning_trainer.apo",
    "SFT": "agentlightning_trainer.sft",
    "SFTConfig": "agentlightning_trainer.sft",
    "Sequential": "agentlightning_trainer.sequence",
}

__all__ = [
    "APO",
    "SFT",
    "APOConfig",
    "LightningRL",
    "LightningRLConfig",
    "MetricsLogger",
    "Policy",
    "PolicyServerProcess",
    "PolicySpec",
    "SFTConfig",
    "Sequential",
    "StepMetrics",
    "TorchLearner",
    "create_policy_app",
    "evaluate_greedy",
    "plot_reward_curve",
    "train_in_process",
]


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:
    from agentlightning_trainer.apo import APO, APOConfig
    from agentlightning_trainer.config import LightningRLConfig, PolicySpec
    from agentlightning_trainer.inprocess import evaluate_greedy, train_in_process
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.metrics import MetricsLogger, StepMetrics
    from agentlightning_trainer.plotting import plot_reward_curve
    from agentlightning_trainer.policy_process import PolicyServerProcess
    from agentlightning_trainer.policy_server import create_policy_app
    from agentlightning_trainer.sequence import Sequential
    from agentlightning_trainer.sft import SFT, SFTConfig
    from agentlightning_trainer.torch_backend.learner import TorchLearner
    from agentlightning_trainer.torch_backend.policy import Policy
