"""SFT: fine-tune the torch policy on the best rollouts per task (selected agent's calls → examples)."""

from agentlightning_trainer.sft.algorithm import SFT, RoundMetrics
from agentlightning_trainer.sft.config import SFTConfig
from agentlightning_trainer.sft.examples import Example, build_examples, fine_tune, select_best

__all__ = ["SFT", "Example", "RoundMetrics", "SFTConfig", "build_examples", "fine_tune", "select_best"]
