"""SFT: fine-tune the policy on the best rollouts of an unmodified agent (rejection-sampling fine-tuning).

Each round, like a LightningRL step: publish an ``LLM`` pointing at the LLM proxy (weights version) → enqueue every
task ``samples_per_task`` times → wait → spans → :class:`~agentlightning.adapter.TraceAdapter` (agent selection,
messages) → keep the best rollouts per task → examples (the engine's token ids, or the chat messages re-tokenised)
→ negative log-likelihood with the torch learner's AdamW → publish new weights (version bump) to the policy server.
Validation runs greedily on the held-out tasks. Resources other than the LLM found in the store's latest snapshot
(e.g. prompt templates an APO run published) are carried into every snapshot, so "prompt then weights" works.
The loop pieces (proxy, publishing, batches, outcomes) are :mod:`agentlightning_trainer.batches`, as in LightningRL.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agentlightning.proxy.server import ServedProxy, start_proxy
from agentlightning.store.base import LightningStore
from agentlightning.types import Rollout
from agentlightning_trainer.batches import (
    mean_reward,
    policy_llm,
    read_outcomes,
    run_policy_batch,
)
from agentlightning_trainer.inprocess import pick_tasks
from agentlightning_trainer.served_policy import ServedPolicyAlgorithm
from agentlightning_trainer.sft.config import SFTConfig
from agentlightning_trainer.sft.examples import Example, build_examples, fine_tune, select_best
from agentlightning_trainer.torch_backend.learner import TorchLearner


@dataclass
class RoundMetrics:
    """What one SFT round did."""

    round: int
    reward_mean: float
    rollouts: int
    selected: int
    examples: int
    engine_examples: int
    policy_version: int
    wall_s: float
    stats: dict[str, float] = field(default_factory=dict[str, float])
    val_reward: float | None = None


class SFT(ServedPolicyAlgorithm):
    """Fine-tunes a torch policy on the best rollouts per task, through the same store, proxy and policy server.

    After :meth:`run`: :attr:`history` (per-round metrics), :attr:`val_history` ((round, greedy reward) pairs,
    round 0 = before training), :attr:`policy`, :attr:`version` and :attr:`weights_path` (the fine-tuned state
    dict, e.g. for ``LightningRLConfig(init_weights=...)``) are filled in.
    """

    def __init__(
        self,
        config: SFTConfig | None = None,
        *,
        run_dir: Path | None = None,
        show_progress: bool = True,
        console: Console | None = None,
        n_server_threads: int = 1,
        **overrides: Any,
    ) -> None:
        """Validate the config now (``overrides`` are config fields), before any model is built or served."""
        base = config or SFTConfig()
        self.config = SFTConfig.model_validate({**base.model_dump(), **overrides}) if overrides else base
        from agentlightning.adapter import TraceAdapter  # a bad agent pattern fails here

        self.adapter = TraceAdapter(agents=self.config.agents, credit="identical", include_messages=True)
        super().__init__(
            run_dir=run_dir, show_progress=show_progress, console=console, n_server_threads=n_server_threads
        )
        self.history: list[RoundMetrics] = []
        self.weights_path: Path | None = None

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Fine-tune for ``config.rounds`` rounds against ``store``."""
        cfg = self.config
        run_dir, policy = self._begin_run(train_tasks, cfg.policy, seed=cfg.seed)
        assert train_tasks  # checked by _begin_run; narrowed for the type checker
        learner = TorchLearner(policy, cfg.learner_config())
        rng = random.Random(cfg.seed)
        weights, server = await self._publish_initial_weights(learner, run_dir, seed=cfg.seed)
        self.weights_path = weights
        assert server is not None  # serve=True
        proxy: ServedProxy | None = None
        try:
            proxy = await start_proxy(store, server.base_url)
            if val_tasks:
                before = await self._validate(store, val_tasks, proxy)
                self.val_history.append((0, before))
                self._say(f"SFT: greedy validation reward before fine-tuning {before:.3f}")
            started = time.perf_counter()
            kept: list[Example] = []
            for round_index in range(1, cfg.rounds + 1):
                n_tasks = cfg.tasks_per_round or len(train_tasks)
                chosen = pick_tasks(rng, train_tasks, n_tasks)
                rollouts = await self._rollouts(store, chosen, proxy, cfg.temperature, round_index)
                outcomes = await read_outcomes(store, rollouts, self.adapter)
                selected = select_best(outcomes, cfg)
                examples = build_examples(selected, policy, cfg)
                kept = [*kept, *examples] if cfg.accumulate else examples
                record = RoundMetrics(
                    round=round_index,
                    reward_mean=mean_reward(outcomes),
                    rollouts=len(outcomes),
                    selected=len(selected),
                    examples=len(examples),
                    engine_examples=sum(e.source == "engine" for e in examples),
                    policy_version=self.version,
                    wall_s=0.0,
                )
                if kept:
                    record.stats = await asyncio.to_thread(fine_tune, learner, kept, cfg)
                    await self._publish_weights(learner, weights, server)
                    record.policy_version = self.version
                else:
                    self._say(
                        f"SFT round {round_index}: no rollout reached min_reward {cfg.min_reward}; nothing to imitate"
                    )
                if val_tasks and (round_index % cfg.val_every == 0 or round_index == cfg.rounds):
                    record.val_reward = await self._validate(store, val_tasks, proxy)
                    self.val_history.append((round_index, record.val_reward))
                record.wall_s = time.perf_counter() - started
                self.history.append(record)
                self._report(record)
        finally:
            if proxy is not None:
                await proxy.stop()
            await asyncio.to_thread(server.stop)

    async def _rollouts(
        self, store: LightningStore, tasks: Sequence[Any], proxy: ServedProxy, temperature: float, round_index: int
    ) -> list[Rollout]:
        """One batch with the current weights: K samples per task when training, one greedy sample when validating."""
        cfg = self.config
        llm = policy_llm(proxy.url, cfg.policy.model_name, self.version, temperature, cfg.max_response_tokens)
        mode = "train" if temperature > 0 else "val"
        return await run_policy_batch(
            store, tasks, proxy, llm, mode=mode, repeat=cfg.samples_per_task if mode == "train" else 1,
            group_prefix=f"sft-r{round_index}-{mode}", timeout_s=cfg.rollout_timeout_s,
        )  # fmt: skip

    async def _validate(self, store: LightningStore, tasks: Sequence[Any], proxy: ServedProxy) -> float:
        """Mean final reward of one greedy rollout per validation task; failures count as 0."""
        rollouts = await self._rollouts(store, tasks, proxy, 0.0, len(self.history))
        return mean_reward(await read_outcomes(store, rollouts, None))

    def _say(self, message: str) -> None:
        if self.show_progress:
            self.console.print(message)

    def _report(self, r: RoundMetrics) -> None:
        val = "" if r.val_reward is None else f" · val {r.val_reward:.3f}"
        nll = f" · nll {r.stats['nll']:.3f}" if "nll" in r.stats else ""
        self._say(
            f"[bold]SFT round {r.round}/{self.config.rounds}[/bold] reward {r.reward_mean:.3f} · kept "
            f"{r.selected}/{r.rollouts} rollouts · {r.examples} examples ({r.engine_examples} with engine ids){nll} · "
            f"weights v{r.policy_version}{val} · {r.wall_s:.1f} s"
        )
