"""LightningStore: the rollout queue, attempts, spans and versioned resources; `open_store` opens one by spec."""

from agentlightning.store._factory import StoreSpec, open_store
from agentlightning.store.base import (
    IllegalTransitionError,
    LightningStore,
    NotFoundError,
    StoreError,
    StoreStatistics,
)
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.store.sync import SyncLightningStore
from agentlightning.store.watchdog import Watchdog

__all__ = [
    "IllegalTransitionError",
    "InMemoryLightningStore",
    "LightningStore",
    "NotFoundError",
    "SqliteLightningStore",
    "StoreError",
    "StoreSpec",
    "StoreStatistics",
    "SyncLightningStore",
    "Watchdog",
    "open_store",
]
