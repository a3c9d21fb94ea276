"""The trainer's credit settings reach the adapter: ``credit_gamma`` discounts step rewards per LLM call."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentlightning.types import Rollout
from agentlightning_trainer.config import LightningRLConfig
from tests.core.adapter.builders import TraceBuilder


def _step_rewards_attempt() -> TraceBuilder:
    """Three calls; a step reward of 1.0 after the first, none after the second, a final reward of 2.0."""
    b = TraceBuilder(rollout_id="ro-1")
    b.llm(prompt=[1], response=[2])
    b.reward(1.0)
    b.llm(prompt=[3], response=[4])
    b.llm(prompt=[5], response=[6])
    b.reward(2.0)
    return b


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_discounted_credit_uses_the_configured_gamma(gamma: float) -> None:
    from agentlightning_trainer.lightning_rl import LightningRL

    algorithm = LightningRL(credit="discounted", credit_gamma=gamma)
    rollout = Rollout(rollout_id="ro-1", input=None, group_id="g", enqueue_time=0)
    rows = algorithm.adapter.adapt(rollout, _step_rewards_attempt().spans)
    # Step rewards per call: [1, 0, 2]; G_2 = 2, G_1 = 0 + g * 2, G_0 = 1 + g * G_1.
    assert [row.reward for row in rows] == pytest.approx([1 + gamma * gamma * 2, gamma * 2, 2.0])


@pytest.mark.parametrize("gamma", [0.0, -0.1, 1.5])
def test_credit_gamma_outside_0_1_is_refused(gamma: float) -> None:
    with pytest.raises(ValidationError, match="credit_gamma"):
        LightningRLConfig(credit_gamma=gamma)
