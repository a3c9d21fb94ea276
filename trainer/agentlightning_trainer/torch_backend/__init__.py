"""The torch backend: tiny GPT / HF causal LMs, batched sampling with logprobs, GRPO/PPO learner."""

from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.model import TinyGPT, TinyGPTConfig
from agentlightning_trainer.torch_backend.policy import Generation, Policy
from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer

__all__ = ["Generation", "Policy", "PolicySpec", "TinyGPT", "TinyGPTConfig", "TorchLearner", "WordCharTokenizer"]
