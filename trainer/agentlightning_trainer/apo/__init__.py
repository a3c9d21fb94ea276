"""APO: automatic prompt optimisation of an agent's named prompt templates (critique-and-edit, beam search)."""

from agentlightning_trainer.apo.algorithm import APO, Candidate
from agentlightning_trainer.apo.config import APOConfig
from agentlightning_trainer.apo.optimizer import CandidateRejected, validate_candidate

__all__ = ["APO", "APOConfig", "Candidate", "CandidateRejected", "validate_candidate"]
