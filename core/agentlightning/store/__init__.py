"""LightningStore: the rollout queue, attempts, spans and versioned resources."""

from agentlightning.store.base import (
    IllegalTransitionError,
    LightningStore,
    NotFoundError,
    StoreError,
    StoreStatistics,
)

__all__ = ["IllegalTransitionError", "LightningStore", "NotFoundError", "StoreError", "StoreStatistics"]
