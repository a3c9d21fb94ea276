"""The algorithm interface: what sits on the other side of the store from the agent."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from agentlightning.store.base import LightningStore


class Algorithm(ABC):
    """Drives training through the store only: enqueue tasks, wait, read spans, update, publish resources.

    An algorithm never imports the agent. ``Trainer.fit`` calls :meth:`run` once, with runners already consuming
    the store's queue; when :meth:`run` returns, the trainer stops the runners.
    """

    @abstractmethod
    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Run the whole algorithm against ``store``."""
