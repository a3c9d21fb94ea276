"""Shared fixtures of the trainer tests: one torch thread (the CI machine has 2 cores), the tool-choice policy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import PolicySpec


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tool_spec() -> PolicySpec:
    """The tiny GPT with the tool-choice task's word tokens."""
    return PolicySpec(words=tool_choice.vocabulary())
