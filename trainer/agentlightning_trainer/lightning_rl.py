"""LightningRL: the RL algorithm that trains a policy from the spans of an unmodified agent.

Each step: publish resources (an ``LLM`` pointing at the LLM proxy, with the weights version, over the non-LLM
resources of the latest snapshot) → enqueue every task ``samples_per_task`` times with one group id → wait → read
spans → :class:`~agentlightning.adapter.TraceAdapter` (agent selection + credit assignment) → GRPO advantages or PPO
→ update → publish new weights (version bump) to the policy server. Validation runs greedily (temperature 0) on the
held-out tasks every ``val_every`` steps. With ``mode="async"`` the rollouts of later steps keep running while the
learner updates, within a staleness bound (:mod:`agentlightning_trainer.async_rollouts`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from agentlightning.proxy.server import start_proxy
from agentlightning.store.base import LightningStore
from agentlightning.types import Rollout, RolloutConfig, RolloutMode, Transition
from agentlightning_trainer.async_rollouts import RolloutPipeline, group_staleness
from agentlightning_trainer.batches import (
    ProxyEndpoint,
    StepBatch,
    collect_batch,
    mean_reward,
    policy_llm,
    publish_llm,
    read_outcomes,
    run_policy_batch,
)
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import as_rng_state, pick_tasks, with_advantages
from agentlightning_trainer.metrics import (
    MetricsLogger,
    RunnerUtilisation,
    StepMetrics,
    group_summary,
    metrics_run_id,
)
from agentlightning_trainer.served_policy import CoHostedProxy, ServedPolicyAlgorithm, store_file
from agentlightning_trainer.torch_backend.learner import TorchLearner

logger = logging.getLogger(__name__)

__all__ = ["LightningRL"]

UpdateFn = Callable[[list[Transition]], Awaitable[dict[str, float]]]
"""Trains on one step's transitions, bumps the policy version and publishes the weights; returns metrics."""
StepEndFn = Callable[[int, float, random.Random], Awaitable[None]]
"""Called after every step with (step, reward EMA, task RNG), e.g. to write a checkpoint."""


class LightningRL(ServedPolicyAlgorithm):
    """GRPO / PPO on the transitions of an agent's LLM calls, with a torch policy served by a policy server.

    After :meth:`run`: :attr:`history` (per-step metrics), :attr:`val_history` ((step, greedy reward) pairs,
    step 0 = before training) and :attr:`policy` (the trained policy) are filled in.
    """

    def __init__(
        self,
        config: LightningRLConfig | None = None,
        *,
        run_dir: Path | None = None,
        upstream_url: str | None = None,
        show_progress: bool = True,
        console: Console | None = None,
        n_server_threads: int = 1,
        **overrides: Any,
    ) -> None:
        """Validate the config now (``overrides`` are config fields), before any model is built or served.

        ``upstream_url`` serves rollouts from an existing OpenAI-compatible server instead of starting the policy
        server (weights are then not published to it: for checking the loop, not for training). ``run_dir`` holds
        the published weights and the policy server's log (a temporary directory when None).
        """
        base = config or LightningRLConfig()
        # Only the fields base was given: a default that depends on another field (tis_cap on mode) follows overrides.
        self.config = (
            LightningRLConfig.model_validate({**base.model_dump(exclude_unset=True), **overrides})
            if overrides
            else base
        )
        if self.config.adapter_per_agent:  # the served policy carries one set of weights per named agent
            spec = self.config.policy.model_copy(update={"adapters": self.config.agent_names})
            self.config = self.config.model_copy(update={"policy": PolicySpec.model_validate(spec.model_dump())})
        if self.config.backend != "torch":
            raise ValueError(
                f"LightningRL runs the torch backend; for backend {self.config.backend!r} use "
                "agentlightning_trainer.verl.VerlLightningRL (or `agl train --backend verl`)"
            )
        from agentlightning.adapter import TraceAdapter  # validates the credit strategy name now

        self.adapter = TraceAdapter(
            agents=self.config.agents,
            credit=self.config.credit,
            gamma=self.config.credit_gamma,
            include_messages=False,
            retokenize=self.config.retokenize,
        )
        super().__init__(
            run_dir=run_dir, show_progress=show_progress, console=console, n_server_threads=n_server_threads
        )
        self.upstream_url = upstream_url
        self.history: list[StepMetrics] = []

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Train for ``config.steps`` steps (or until ``stop_at_reward``) against ``store``."""
        cfg = self.config
        run_dir, policy = self._begin_run(train_tasks, cfg.policy, seed=cfg.seed, init_weights=cfg.init_weights)
        assert train_tasks  # checked by _begin_run; narrowed for the type checker
        learner = TorchLearner(policy, cfg)
        if cfg.retokenize != "off":  # calls recorded without token ids are rendered as this policy's server would
            from agentlightning_trainer.retokenize import ChatRetokenizer

            self.adapter.retokenizer = ChatRetokenizer.for_policy(policy)
        rng = random.Random(cfg.seed)
        start_step, ema = 0, 0.0
        if cfg.checkpoint_dir is not None and cfg.resume:
            restored = learner.load_checkpoint(cfg.checkpoint_dir)
            if restored is not None:
                start_step, extra = restored
                ema = float(extra.get("ema", 0.0))
                self.version = int(extra.get("version", start_step))
                rng.setstate(as_rng_state(extra["task_rng"]))
        serve = self.upstream_url is None
        # A SQLite store can be opened by the policy server process too: the proxy then runs there, beside
        # generation, rather than on this process's interpreter, which also runs the runners and the learner.
        weights, server = await self._publish_initial_weights(
            learner, run_dir, seed=cfg.seed, serve=serve, proxy_store=store_file(store) if serve else None
        )

        async def update(transitions: list[Transition]) -> dict[str, float]:
            rows, extra = with_advantages(transitions, cfg)
            if not rows:  # every group tied and dropped: nothing to learn, nothing new to publish
                return extra
            extra = await asyncio.to_thread(learner.update, rows) | extra
            await self._publish_weights(learner, weights, server)
            return extra

        async def checkpoint(step: int, ema: float, rng: random.Random) -> None:
            if cfg.checkpoint_dir is not None and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
                state = {"ema": ema, "version": self.version, "task_rng": rng.getstate()}
                await asyncio.to_thread(learner.save_checkpoint, cfg.checkpoint_dir, step, state)

        proxy: ProxyEndpoint | None = None
        try:
            if server is not None and server.proxy_url is not None:
                proxy = CoHostedProxy(server.proxy_url, server)
            else:
                proxy = await start_proxy(store, self.upstream_url or (server.base_url if server else ""))
            await self._train_steps(
                store, train_tasks, val_tasks, proxy, update,
                rng=rng, start_step=start_step, ema=ema, on_step_end=checkpoint,
            )  # fmt: skip
        finally:
            if proxy is not None:
                await proxy.stop()
            if server is not None:
                await asyncio.to_thread(server.stop)

    async def _train_steps(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any],
        val_tasks: Sequence[Any] | None,
        proxy: ProxyEndpoint,
        update: UpdateFn,
        *,
        rng: random.Random,
        start_step: int = 0,
        ema: float = 0.0,
        on_step_end: StepEndFn | None = None,
    ) -> None:
        """The step loop both backends share: rollouts → transitions → ``update`` → metrics, validation, stop."""
        cfg = self.config
        metrics = MetricsLogger(
            cfg.steps, log_dir=cfg.log_dir, show_progress=self.show_progress, console=self.console,
            store=store, run_id=metrics_run_id(cfg.checkpoint_dir),
        )  # fmt: skip
        utilisation = RunnerUtilisation()
        pipeline: RolloutPipeline | None = None
        with metrics:
            if start_step > 0:
                await self._cancel_left_over_rollouts(store)
            if val_tasks and start_step == 0:
                before = await self._validate(store, val_tasks, proxy)
                self.val_history.append((0, before))
                metrics.log_validation(0, before)
            started = time.perf_counter()
            if cfg.mode == "async":
                pipeline = await self._start_pipeline(store, train_tasks, proxy, rng)
            try:
                await self._step_loop(
                    store, train_tasks, val_tasks, proxy, update, metrics, utilisation, pipeline,
                    rng=rng, start_step=start_step, ema=ema, started=started, on_step_end=on_step_end,
                )  # fmt: skip
            finally:
                if pipeline is not None:
                    cancelled = await pipeline.close(cfg.rollout_timeout_s)
                    if cancelled:
                        logger.info("async: %d queued rollouts cancelled at the end of training", len(cancelled))

    async def _cancel_left_over_rollouts(self, store: LightningStore) -> None:
        """Cancel the rollouts an earlier trainer of this run enqueued and left unfinished (a run resumed after a
        crash): no learner reads them any more (their groups were issued by weights newer than the checkpoint), and
        the runners would otherwise spend a step or two on them. A runner inside one sees its result refused."""
        unfinished = await store.query_rollouts(status=["queuing", "requeuing", "preparing", "running"])
        left = [
            r for r in unfinished if r.mode in ("train", "val") and (r.group_id or "").startswith(("train-", "val-"))
        ]
        results = await asyncio.gather(*(store.cancel_rollout(r.rollout_id) for r in left), return_exceptions=True)
        cancelled = sum(1 for result in results if not isinstance(result, BaseException))  # others finished meanwhile
        if cancelled:
            logger.warning("resumed: cancelled %d rollouts the previous trainer left unfinished", cancelled)

    async def _start_pipeline(
        self, store: LightningStore, train_tasks: Sequence[Any], proxy: ProxyEndpoint, rng: random.Random
    ) -> RolloutPipeline:
        """Publish the training LLM and start keeping task groups in flight (``mode="async"``)."""
        cfg = self.config
        pipeline = RolloutPipeline(
            store, train_tasks, rng, adapter=self.adapter, proxy=proxy, tasks_per_step=cfg.tasks_per_step,
            samples_per_task=cfg.samples_per_task, max_staleness=cfg.max_staleness,
            rollout_config=self._rollout_config(), max_prompt_tokens=cfg.max_prompt_tokens,
            resources_id=await self._publish_train_llm(store, proxy), version=self.version,
        )  # fmt: skip
        await pipeline.start()
        return pipeline

    async def _publish_train_llm(self, store: LightningStore, proxy: ProxyEndpoint) -> str:
        """Publish the training rollouts' LLM at the current version; returns the snapshot id."""
        cfg = self.config
        llm = policy_llm(
            proxy.url, cfg.policy.model_name, self.version, cfg.temperature, cfg.max_response_tokens,
            cfg.policy.adapters,
        )  # fmt: skip
        return (await publish_llm(store, llm)).resources_id

    def _rollout_config(self) -> RolloutConfig:
        """Limits and retries of one training rollout."""
        cfg = self.config
        return RolloutConfig(
            timeout_s=cfg.rollout_timeout_s,
            heartbeat_timeout_s=cfg.rollout_heartbeat_timeout_s,
            max_attempts=cfg.rollout_max_attempts,
        )

    async def _step_loop(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any],
        val_tasks: Sequence[Any] | None,
        proxy: ProxyEndpoint,
        update: UpdateFn,
        metrics: MetricsLogger,
        utilisation: RunnerUtilisation,
        pipeline: RolloutPipeline | None,
        *,
        rng: random.Random,
        start_step: int,
        ema: float,
        started: float,
        on_step_end: StepEndFn | None,
    ) -> None:
        """The steps of :meth:`_train_steps`: rollouts (this step's, or the pipeline's finished groups) → update."""
        cfg = self.config
        skipped_in_a_row = 0  # steps whose batch had no trainable transition, since the last update
        for step in range(start_step + 1, cfg.steps + 1):
            t0, t0_ns = time.perf_counter(), time.time_ns()
            stale_groups = stale_rollouts = 0
            if pipeline is None:
                chosen = pick_tasks(rng, train_tasks, cfg.tasks_per_step)
                rollouts = await self._run_rollouts(store, chosen, "train", proxy, step)
                wait_s = time.perf_counter() - t0
                batch = await collect_batch(store, rollouts, self.adapter, max_prompt_tokens=cfg.max_prompt_tokens)
                staleness: dict[int, int] = {}
                for lag in group_staleness(batch, self.version, self.version):
                    staleness[lag] = staleness.get(lag, 0) + 1
            else:
                taken = await pipeline.next_batch(self.version)
                batch, rollouts, staleness, wait_s = taken.batch, taken.rollouts, taken.staleness, taken.wait_s
                stale_groups, stale_rollouts = taken.stale_groups_dropped, taken.stale_rollouts_dropped
            rollout_s = time.perf_counter() - t0
            reward_mean, all_same = group_summary(batch.rewards_by_group)
            ema = reward_mean if step == 1 else cfg.ema_decay * ema + (1 - cfg.ema_decay) * reward_mean
            t1 = time.perf_counter()
            extra: dict[str, float] = {}
            lag = 0.0
            skipped = not batch.transitions
            if skipped:
                diagnosis = await self._diagnose(store, batch)
                metrics.warn(f"step {step}: skipped, {diagnosis}")
                skipped_in_a_row += 1
                if skipped_in_a_row >= cfg.max_skipped_steps:
                    raise RuntimeError(
                        f"{skipped_in_a_row} steps in a row had nothing to train on; stopping instead of "
                        f"running the other {cfg.steps - step} steps. Last diagnosis: {diagnosis}. Run `agl check "
                        "--store ...` on the store for every problem (max_skipped_steps sets this limit)."
                    )
            else:
                skipped_in_a_row = 0
                lag = sum(self.version - (t.policy_version or 0) for t in batch.transitions) / len(batch.transitions)
                if step == start_step + 1:
                    _check_agents_called(cfg.policy.adapters, batch.transitions)
                extra = await update(batch.transitions)
            utilisation.observe(rollouts)
            if pipeline is not None:
                # New weights: groups issued from now on say so in their resources (the served version is what
                # each call records either way).
                fresh = pipeline.version != self.version
                resources_id = await self._publish_train_llm(store, proxy) if fresh else None
                await pipeline.step_done(self.version, resources_id)
                in_flight = pipeline.in_flight_ids
                if in_flight:
                    utilisation.observe(await store.query_rollouts(rollout_ids=in_flight))
            step_s = time.perf_counter() - t0
            retokenized = self.adapter.take_retokenize_counts()  # calls without token ids, since the last step
            if retokenized.retokenized or retokenized.failed:
                extra = {**extra, **retokenized.metrics()}
            record = StepMetrics(
                step=step,
                reward_mean=reward_mean,
                reward_ema=ema,
                all_same_frac=all_same,
                transitions=len(batch.transitions),
                rollouts=len(rollouts),
                failed_rollouts=batch.failed,
                policy_version=self.version,
                policy_lag=lag,
                rollout_s=rollout_s,
                update_s=time.perf_counter() - t1,
                skipped=skipped,
                wall_s=time.perf_counter() - started,
                extra=extra,
                staleness=staleness,
                stale_groups_dropped=stale_groups,
                stale_rollouts_dropped=stale_rollouts,
                runner_idle_frac=utilisation.idle_fraction(t0_ns, time.time_ns()),
                learner_idle_frac=wait_s / step_s if step_s > 0 else None,
            )
            self.history.append(record)
            metrics.log(record)
            stop = cfg.stop_at_reward is not None and ema >= cfg.stop_at_reward
            if val_tasks and (step % cfg.val_every == 0 or step == cfg.steps or stop):
                val = await self._validate(store, val_tasks, proxy)
                self.val_history.append((step, val))
                metrics.log_validation(step, val)
            # After validation, so the step's record carries its val_reward; a store failure only logs.
            await metrics.log_to_store(record)
            if on_step_end is not None:
                await on_step_end(step, ema, rng)
            if stop:
                break

    async def _run_rollouts(
        self, store: LightningStore, tasks: Sequence[Any], mode: RolloutMode, proxy: ProxyEndpoint, step: int
    ) -> list[Rollout]:
        """One batch with the current weights: K samples per task when training, one greedy sample when validating."""
        cfg = self.config
        temperature = cfg.temperature if mode == "train" else 0.0
        llm = policy_llm(
            proxy.url, cfg.policy.model_name, self.version, temperature, cfg.max_response_tokens, cfg.policy.adapters
        )
        return await run_policy_batch(
            store, tasks, proxy, llm, mode=mode, repeat=cfg.samples_per_task if mode == "train" else 1,
            group_prefix=f"{mode}-s{step}", timeout_s=cfg.rollout_timeout_s,
            config=self._rollout_config() if mode == "train" else None,
        )  # fmt: skip

    async def _validate(self, store: LightningStore, tasks: Sequence[Any], proxy: ProxyEndpoint) -> float:
        """Mean final reward of one greedy (temperature 0) rollout per validation task; failures count as 0."""
        rollouts = await self._run_rollouts(store, tasks, "val", proxy, len(self.history))
        return mean_reward(await read_outcomes(store, rollouts, None))

    async def _diagnose(self, store: LightningStore, batch: StepBatch) -> str:
        """Why a batch has nothing to train on, in the words of the adapter's check (``agl check``)."""
        if batch.rollout_ids and batch.failed == len(batch.rollout_ids):
            return f"all {batch.failed} rollouts failed or recorded no reward (see their attempts' errors)"
        from agentlightning.adapter import check_store

        report = await check_store(
            store,
            agents=self.config.agents,
            rollout_ids=batch.rollout_ids,
            max_prompt_tokens=self.config.max_prompt_tokens,
            retokenizer=self.adapter.retokenizer,
            retokenize=self.config.retokenize,
        )
        problems = sorted(set(p.split(": ", 1)[-1] for p in report.problems))
        return f"no trainable transitions ({report.summary()}): " + ("; ".join(problems[:3]) or "no problem reported")


def _check_agents_called(adapters: Sequence[str], transitions: Sequence[Transition]) -> None:
    """Stop a per-agent run whose named agent made no call in a whole first step: a misspelt name would otherwise
    train weights nobody is served with."""
    seen = {t.agent_name for t in transitions}
    missing = [a for a in adapters if a not in seen]
    if missing:
        names = sorted(n for n in seen if n is not None)
        raise ValueError(
            f"adapter_per_agent: agent(s) {missing} made no trainable call in the first step; calls came from "
            f"{names or 'no named agent'}. Check the names in agents=[...] against your agents' names "
            "(agl check lists them)"
        )
