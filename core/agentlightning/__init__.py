"""Agent Lightning: train the AI agents you already have, without rewriting them.

Public names are loaded lazily so that ``import agentlightning`` stays fast and pulls in no framework.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Span": "agentlightning.types",
    "SpanEvent": "agentlightning.types",
    "SpanLink": "agentlightning.types",
    "SpanStatus": "agentlightning.types",
    "Rollout": "agentlightning.types",
    "RolloutConfig": "agentlightning.types",
    "RolloutRequest": "agentlightning.types",
    "Attempt": "agentlightning.types",
    "ClaimedRollout": "agentlightning.types",
    "LLM": "agentlightning.types",
    "PromptTemplate": "agentlightning.types",
    "ResourcesSnapshot": "agentlightning.types",
    "Transition": "agentlightning.types",
    "emit_reward": "agentlightning.emit",
    "emit_message": "agentlightning.emit",
    "emit_object": "agentlightning.emit",
    "emit_exception": "agentlightning.emit",
    "emit_annotation": "agentlightning.emit",
    "operation": "agentlightning.emit",
    "find_rewards": "agentlightning.emit",
    "final_reward": "agentlightning.emit",
    "rollout_context": "agentlightning.tracing",
    "current_rollout": "agentlightning.tracing",
    "get_tracer": "agentlightning.tracing",
    "LightningTracer": "agentlightning.tracing",
    "LightningStore": "agentlightning.store",
    "InMemoryLightningStore": "agentlightning.store",
    "SqliteLightningStore": "agentlightning.store",
    "SyncLightningStore": "agentlightning.store",
    "LightningStoreClient": "agentlightning.client",
    "rollout": "agentlightning.agent",
    "LitAgent": "agentlightning.agent",
    "Runner": "agentlightning.runner",
    "Algorithm": "agentlightning.algorithm",
    "Trainer": "agentlightning.trainer",
    "init_tracing": "agentlightning.tracing",
    "shutdown_tracing": "agentlightning.tracing",
    "ListSpanSink": "agentlightning.tracing",
    "StoreSpanSink": "agentlightning.tracing",
    "Watchdog": "agentlightning.store",
    "TraceAdapter": "agentlightning.adapter",
    "check_store": "agentlightning.adapter",
}

__all__ = [  # noqa: RUF022 - in the order of _EXPORTS
    "Span",
    "SpanEvent",
    "SpanLink",
    "SpanStatus",
    "Rollout",
    "RolloutConfig",
    "RolloutRequest",
    "Attempt",
    "ClaimedRollout",
    "LLM",
    "PromptTemplate",
    "ResourcesSnapshot",
    "Transition",
    "emit_reward",
    "emit_message",
    "emit_object",
    "emit_exception",
    "emit_annotation",
    "operation",
    "find_rewards",
    "final_reward",
    "rollout_context",
    "current_rollout",
    "get_tracer",
    "LightningTracer",
    "LightningStore",
    "InMemoryLightningStore",
    "SqliteLightningStore",
    "SyncLightningStore",
    "LightningStoreClient",
    "rollout",
    "LitAgent",
    "Runner",
    "Algorithm",
    "Trainer",
    "init_tracing",
    "shutdown_tracing",
    "ListSpanSink",
    "StoreSpanSink",
    "Watchdog",
    "TraceAdapter",
    "check_store",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import public names on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlightning' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from agentlightning.adapter import (
        TraceAdapter as TraceAdapter,
        check_store as check_store,
    )
    from agentlightning.agent import (
        LitAgent as LitAgent,
        rollout as rollout,
    )
    from agentlightning.algorithm import (
        Algorithm as Algorithm,
    )
    from agentlightning.client import (
        LightningStoreClient as LightningStoreClient,
    )
    from agentlightning.emit import (
        emit_annotation as emit_annotation,
        emit_exception as emit_exception,
        emit_message as emit_message,
        emit_object as emit_object,
        emit_reward as emit_reward,
        final_reward as final_reward,
        find_rewards as find_rewards,
        operation as operation,
    )
    from agentlightning.runner import (
        Runner as Runner,
    )
    from agentlightning.store import (
        InMemoryLightningStore as InMemoryLightningStore,
        LightningStore as LightningStore,
        SqliteLightningStore as SqliteLightningStore,
        SyncLightningStore as SyncLightningStore,
        Watchdog as Watchdog,
    )
    from agentlightning.tracing import (
        LightningTracer as LightningTracer,
        ListSpanSink as ListSpanSink,
        StoreSpanSink as StoreSpanSink,
        current_rollout as current_rollout,
        get_tracer as get_tracer,
        init_tracing as init_tracing,
        rollout_context as rollout_context,
        shutdown_tracing as shutdown_tracing,
    )
    from agentlightning.trainer import (
        Trainer as Trainer,
    )
    from agentlightning.types import (
        LLM as LLM,
        Attempt as Attempt,
        ClaimedRollout as ClaimedRollout,
        PromptTemplate as PromptTemplate,
        ResourcesSnapshot as ResourcesSnapshot,
        Rollout as Rollout,
        RolloutConfig as RolloutConfig,
        RolloutRequest as RolloutRequest,
        Span as Span,
        SpanEvent as SpanEvent,
        SpanLink as SpanLink,
        SpanStatus as SpanStatus,
        Transition as Transition,
    )
