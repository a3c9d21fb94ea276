"""Built-in algorithms of core; RL, APO and SFT live in the ``agentlightning_trainer`` package."""

from agentlightning.algorithms.baseline import BaselineAlgorithm, ModeSummary

__all__ = ["BaselineAlgorithm", "ModeSummary"]
