"""The verl suite runs in its own environment (.venv-verl, see requirements-verl.txt); elsewhere it skips.

verl's own import-time warnings are not ours to fix; each ignore below names where it comes from.
"""

from __future__ import annotations

import pytest

from agentlightning.types import Transition

# Warnings raised while verl imports (the suite turns every other warning into an error):
VERL_IMPORT_WARNINGS = (
    # verl.workers.engine.__init__ announces each optional engine it cannot import (torchtitan, veomni, ...).
    r"ignore:\w+ engine is not available:UserWarning",
    # verl imports ray.experimental.state, which ray 2.60 deprecates in favour of ray.util.state.
    r"ignore::DeprecationWarning:ray\.util\.state\.util",
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the narrow verl ignores (collection imports verl, so per-test markers would come too late)."""
    for rule in VERL_IMPORT_WARNINGS:
        config.addinivalue_line("filterwarnings", rule)


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
