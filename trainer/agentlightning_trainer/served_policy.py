"""The base of the algorithms that train a torch policy served by a policy server behind the LLM proxy.

LightningRL and SFT share it: where the run's files go, the progress console, the policy server started on the
learner's weights, and what is filled in after a run (``policy``, ``version``, ``val_history``).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from agentlightning.algorithm import Algorithm
from agentlightning.store.base import LightningStore
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.policy_process import PolicyServerProcess
from agentlightning_trainer.torch_backend.learner import TorchLearner, load_initial_weights
from agentlightning_trainer.torch_backend.policy import Policy


@dataclass
class CoHostedProxy:
    """The LLM proxy served by the policy server process (``PolicyServerProcess(proxy_store=...)``)."""

    url: str
    server: PolicyServerProcess

    async def flush(self) -> None:
        """Wait until every call the proxy has answered so far is in the store."""
        await self.server.flush_proxy()

    async def stop(self) -> None:
        """Nothing to do: the proxy stops with its policy server."""


def store_file(store: LightningStore) -> Path | None:
    """The file of a SQLite store, which another process can open too; None for any other store."""
    from agentlightning.store.sqlite import SqliteLightningStore

    return Path(store.path) if isinstance(store, SqliteLightningStore) else None


class ServedPolicyAlgorithm(Algorithm):
    """An algorithm whose policy is trained here and served to the agents by a policy server process."""

    def __init__(
        self, *, run_dir: Path | None, show_progress: bool, console: Console | None, n_server_threads: int
    ) -> None:
        """``run_dir`` holds the published weights and the server's log (a temporary directory when None)."""
        self.run_dir = run_dir
        self.show_progress = show_progress
        self.console = console or Console(stderr=True)
        self.n_server_threads = n_server_threads
        self.val_history: list[tuple[int, float]] = []
        self.policy: Policy | None = None
        self.version = 0

    def _begin_run(
        self, train_tasks: Sequence[Any] | None, spec: PolicySpec, *, seed: int, init_weights: Path | None = None
    ) -> tuple[Path, Policy]:
        """Check for training tasks, create the run directory, build the policy (from ``init_weights`` if set).

        The weights are loaded before any learner exists, so a KL reference copied from the policy starts there too.
        """
        name = type(self).__name__
        if not train_tasks:
            raise ValueError(f"{name} needs training tasks: trainer.fit(agent, train_tasks, val_tasks)")
        run_dir = self.run_dir or Path(tempfile.mkdtemp(prefix=f"{name.lower()}-"))
        run_dir.mkdir(parents=True, exist_ok=True)
        policy = self.policy = Policy.build(spec, seed=seed)
        if init_weights is not None:
            load_initial_weights(policy, init_weights)
        return run_dir, policy

    async def _publish_initial_weights(
        self, learner: TorchLearner, run_dir: Path, *, seed: int, serve: bool = True, proxy_store: Path | None = None
    ) -> tuple[Path, PolicyServerProcess | None]:
        """Write the learner's weights to ``run_dir/weights.pt`` and, with ``serve``, start a policy server on them.

        With ``proxy_store`` (a SQLite store file) the server process also serves the LLM proxy into that store.
        """
        weights = run_dir / "weights.pt"
        learner.save_weights(weights)
        if not serve:
            return weights, None
        server = PolicyServerProcess(
            learner.policy.spec, weights, version=self.version, seed=seed, threads=self.n_server_threads,
            log_file=run_dir / "policy_server.log", proxy_store=proxy_store,
        )  # fmt: skip
        await asyncio.to_thread(server.start)
        return weights, server

    async def _publish_weights(self, learner: TorchLearner, weights: Path, server: PolicyServerProcess | None) -> None:
        """Bump the policy version, write the learner's weights, and hot-load them into ``server``."""
        self.version += 1
        await asyncio.to_thread(learner.save_weights, weights)
        if server is not None:
            await server.publish(weights, self.version)
