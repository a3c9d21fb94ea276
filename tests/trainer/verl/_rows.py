"""Transitions with token ids for the verl suite."""

from __future__ import annotations

from agentlightning.types import Transition


def make_transition(
    rollout: str,
    group: str,
    *,
    turn: int = 0,
    prompt: list[int] | None = None,
    response: list[int] | None = None,
    reward: float = 0.0,
    advantage: float | None = None,
    logprobs: list[float] | None = None,
    mask: list[int] | None = None,
) -> Transition:
    """A transition with token ids; lengths default to small distinct values."""
    return Transition(
        rollout_id=rollout,
        attempt_id=f"at-{rollout}",
        group_id=group,
        turn_index=turn,
        span_id=f"{turn:016x}",
        prompt_token_ids=prompt if prompt is not None else [11, 12, 13],
        response_token_ids=response if response is not None else [21, 22],
        response_logprobs=logprobs,
        reward=reward,
        advantage=advantage,
        response_mask=mask,
    )
