"""Transitions: what the trainer consumes, one per selected LLM call."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Transition(BaseModel):
    """One LLM call of one rollout, with its share of the reward after credit assignment."""

    rollout_id: str
    attempt_id: str
    group_id: str = Field(description="The task: GRPO normalises rewards of rollouts within a group.")
    agent_name: str | None = Field(default=None, description="gen_ai.agent.name of the call, if known.")
    turn_index: int = Field(description="Position of the call among the rollout's calls (0-based, all agents).")
    span_id: str = Field(description="span_id of the LLM span the transition came from.")
    prompt_token_ids: list[int] = Field(default_factory=list[int])
    response_token_ids: list[int] = Field(default_factory=list[int])
    response_logprobs: list[float] | None = None
    reward: float = Field(description="The call's reward after credit assignment.")
    advantage: float | None = Field(default=None, description="Filled in by advantage estimators.")
    response_advantages: list[float] | None = Field(
        default=None,
        description="Per response token advantage, overriding `advantage`: set when rows that carry advantages are "
        "merged into one trajectory (each call's tokens keep their call's advantage; observation tokens 0).",
    )
    policy_version: int | None = None
    prompt_messages: list[dict[str, Any]] | None = Field(
        default=None, description="Input messages (OpenAI chat shape), for text-based algorithms (APO, SFT)."
    )
    response_messages: list[dict[str, Any]] | None = None
    response_mask: list[int] | None = Field(
        default=None, description="1 on model tokens, 0 on observation tokens (set by trajectory aggregation)."
    )

    @property
    def has_token_ids(self) -> bool:
        """True when both prompt and response token ids are present (required for RL)."""
        return bool(self.prompt_token_ids) and bool(self.response_token_ids)
