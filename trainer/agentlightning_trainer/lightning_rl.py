"""LightningRL: the RL algorithm that trains a policy from the spans of an unmodified agent.

Each step: publish resources (an ``LLM`` pointing at the LLM proxy, with the weights version) → enqueue every task
``samples_per_task`` times with one group id → wait → read spans → :class:`~agentlightning.adapter.TraceAdapter`
(agent selection + credit assignment) → GRPO advantages or PPO → update → publish new weights (version bump) to the
policy server. Validation runs greedily (temperature 0) on the held-out tasks every ``val_every`` steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agentlightning.algorithm import Algorithm
from agentlightning.store.base import LightningStore
from agentlightning.types import LLM, Rollout, RolloutConfig, RolloutMode, RolloutRequest, Transition
from agentlightning_trainer.config import LightningRLConfig
from agentlightning_trainer.inprocess import as_rng_state, pick_tasks, with_advantages
from agentlightning_trainer.metrics import MetricsLogger, StepMetrics, group_summary
from agentlightning_trainer.policy_server import PolicyServerProcess, free_port
from agentlightning_trainer.torch_backend.learner import TorchLearner
from agentlightning_trainer.torch_backend.policy import Policy

logger = logging.getLogger(__name__)

LLM_RESOURCE = "llm"


@dataclass
class StepBatch:
    """What one batch of rollouts yielded: transitions to train on, reward per group, failures."""

    transitions: list[Transition] = field(default_factory=list)
    rewards_by_group: dict[str, list[float]] = field(default_factory=dict)
    failed: int = 0
    rollout_ids: list[str] = field(default_factory=list)


async def collect_batch(
    store: LightningStore, rollouts: Sequence[Rollout], adapter: Any, *, max_prompt_tokens: int | None = None
) -> StepBatch:
    """Transitions of the succeeded rollouts (failed, cancelled and unfinished ones are excluded) and their rewards."""
    from agentlightning.emit import final_reward

    batch = StepBatch(rollout_ids=[r.rollout_id for r in rollouts])
    for rollout in rollouts:
        if rollout.status != "succeeded":
            batch.failed += 1
            continue
        spans = await store.query_spans(rollout.rollout_id, "latest")
        reward = final_reward(spans)
        if reward is None:
            batch.failed += 1
            continue
        batch.rewards_by_group.setdefault(rollout.group_id or rollout.rollout_id, []).append(reward)
        for t in adapter.adapt(rollout, spans):
            if t.has_token_ids and (max_prompt_tokens is None or len(t.prompt_token_ids) <= max_prompt_tokens):
                batch.transitions.append(t)
    return batch


class LightningRL(Algorithm):
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
        self.config = LightningRLConfig.model_validate({**base.model_dump(), **overrides}) if overrides else base
        if self.config.backend != "torch":
            raise ValueError(
                f"LightningRL runs the torch backend; for backend {self.config.backend!r} use "
                "agentlightning_trainer.verl.VerlLightningRL (or `agl train --backend verl`)"
            )
        from agentlightning.adapter import TraceAdapter  # validates the credit strategy name now

        self.adapter = TraceAdapter(agents=self.config.agents, credit=self.config.credit, include_messages=False)
        self.run_dir = run_dir
        self.upstream_url = upstream_url
        self.show_progress = show_progress
        self.console = console or Console(stderr=True)
        self.n_server_threads = n_server_threads
        self.history: list[StepMetrics] = []
        self.val_history: list[tuple[int, float]] = []
        self.policy: Policy | None = None
        self.version = 0

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Train for ``config.steps`` steps (or until ``stop_at_reward``) against ``store``."""
        from agentlightning.proxy import flush_proxy_spans

        if not train_tasks:
            raise ValueError("LightningRL needs training tasks: trainer.fit(agent, train_tasks, val_tasks)")
        cfg = self.config
        run_dir = self.run_dir or Path(tempfile.mkdtemp(prefix="lightning-rl-"))
        run_dir.mkdir(parents=True, exist_ok=True)
        policy = self.policy = Policy.build(cfg.policy, seed=cfg.seed)
        learner = TorchLearner(policy, cfg)
        rng = random.Random(cfg.seed)
        start_step, ema = 0, 0.0
        if cfg.checkpoint_dir is not None and cfg.resume:
            restored = learner.load_checkpoint(cfg.checkpoint_dir)
            if restored is not None:
                start_step, extra = restored
                ema = float(extra.get("ema", 0.0))
                self.version = int(extra.get("version", start_step))
                rng.setstate(as_rng_state(extra["task_rng"]))
        weights = run_dir / "weights.pt"
        learner.save_weights(weights)
        server: PolicyServerProcess | None = None
        if self.upstream_url is None:
            server = PolicyServerProcess(
                cfg.policy, weights, version=self.version, seed=cfg.seed, threads=self.n_server_threads,
                log_file=run_dir / "policy_server.log",
            )  # fmt: skip
            await asyncio.to_thread(server.start)
        upstream = self.upstream_url or (server.base_url if server else "")
        proxy_app, proxy_url, proxy_task, proxy_server = await _start_proxy(store, upstream)
        metrics = MetricsLogger(cfg.steps, log_dir=cfg.log_dir, show_progress=self.show_progress, console=self.console)
        try:
            with metrics:
                if val_tasks and start_step == 0:
                    before = await self._validate(store, val_tasks, proxy_url, proxy_app)
                    self.val_history.append((0, before))
                    metrics.log_validation(0, before)
                started = time.perf_counter()
                for step in range(start_step + 1, cfg.steps + 1):
                    t0 = time.perf_counter()
                    chosen = pick_tasks(rng, train_tasks, cfg.tasks_per_step)
                    rollouts = await self._run_rollouts(store, chosen, "train", proxy_url, cfg.temperature, step)
                    await flush_proxy_spans(proxy_app)
                    batch = await collect_batch(store, rollouts, self.adapter, max_prompt_tokens=cfg.max_prompt_tokens)
                    rollout_s = time.perf_counter() - t0
                    reward_mean, all_same = group_summary(batch.rewards_by_group)
                    ema = reward_mean if step == 1 else cfg.ema_decay * ema + (1 - cfg.ema_decay) * reward_mean
                    t1 = time.perf_counter()
                    extra: dict[str, float] = {}
                    lag = 0.0
                    skipped = not batch.transitions
                    if skipped:
                        metrics.warn(f"step {step}: skipped, {await self._diagnose(store, batch)}")
                    else:
                        lag = sum(self.version - (t.policy_version or 0) for t in batch.transitions) / len(
                            batch.transitions
                        )
                        extra = await asyncio.to_thread(learner.update, with_advantages(batch.transitions, cfg))
                        self.version += 1
                        await asyncio.to_thread(learner.save_weights, weights)
                        if server is not None:
                            await server.publish(weights, self.version)
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
                    )
                    self.history.append(record)
                    metrics.log(record)
                    stop = cfg.stop_at_reward is not None and ema >= cfg.stop_at_reward
                    if val_tasks and (step % cfg.val_every == 0 or step == cfg.steps or stop):
                        val = await self._validate(store, val_tasks, proxy_url, proxy_app)
                        self.val_history.append((step, val))
                        metrics.log_validation(step, val)
                    if cfg.checkpoint_dir is not None and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
                        state = {"ema": ema, "version": self.version, "task_rng": rng.getstate()}
                        await asyncio.to_thread(learner.save_checkpoint, cfg.checkpoint_dir, step, state)
                    if stop:
                        break
        finally:
            proxy_server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await proxy_task
            if server is not None:
                await asyncio.to_thread(server.stop)

    async def _run_rollouts(
        self, store: LightningStore, tasks: Sequence[Any], mode: RolloutMode, proxy_url: str, temperature: float,
        step: int,
    ) -> list[Rollout]:  # fmt: skip
        """Publish resources for this batch, enqueue it, wait for it; unfinished rollouts are cancelled."""
        cfg = self.config
        llm = LLM(
            base_url=proxy_url,
            model=cfg.policy.model_name,
            proxied=True,
            weights_version=self.version,
            sampling={"temperature": temperature, "max_tokens": cfg.max_response_tokens},
        )
        snapshot = await store.add_resources({LLM_RESOURCE: llm})
        repeat = cfg.samples_per_task if mode == "train" else 1
        config = RolloutConfig(timeout_s=cfg.rollout_timeout_s)
        requests: list[RolloutRequest] = []
        for index, task in enumerate(tasks):
            group = f"{mode}-s{step}-t{index}-{uuid.uuid4().hex[:8]}"
            requests.extend(
                RolloutRequest(input=task, mode=mode, group_id=group, resources_id=snapshot.resources_id, config=config)
                for _ in range(repeat)
            )
        enqueued = await store.enqueue_rollouts(requests)
        ids = [r.rollout_id for r in enqueued]
        done = {r.rollout_id for r in await store.wait_for_rollouts(ids, timeout_s=cfg.rollout_timeout_s + 30)}
        for rollout_id in ids:
            if rollout_id not in done:
                with contextlib.suppress(Exception):  # it may finish between the wait and the cancel
                    await store.cancel_rollout(rollout_id)
        rollouts = await store.query_rollouts(rollout_ids=ids)
        order = {rid: i for i, rid in enumerate(ids)}
        return sorted(rollouts, key=lambda r: order[r.rollout_id])

    async def _validate(self, store: LightningStore, tasks: Sequence[Any], proxy_url: str, proxy_app: Any) -> float:
        """Mean final reward of one greedy (temperature 0) rollout per validation task; failures count as 0."""
        from agentlightning.emit import final_reward
        from agentlightning.proxy import flush_proxy_spans
        from agentlightning.semconv import SPAN_REWARD

        rollouts = await self._run_rollouts(store, tasks, "val", proxy_url, 0.0, len(self.history))
        await flush_proxy_spans(proxy_app)
        rewards: list[float] = []
        for rollout in rollouts:
            reward = None
            if rollout.status == "succeeded":
                reward = final_reward(await store.query_spans(rollout.rollout_id, "latest", name=SPAN_REWARD))
            rewards.append(reward or 0.0)
        return sum(rewards) / max(1, len(rewards))

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
        )
        problems = sorted(set(p.split(": ", 1)[-1] for p in report.problems))
        return f"no trainable transitions ({report.summary()}): " + ("; ".join(problems[:3]) or "no problem reported")


async def _start_proxy(store: LightningStore, upstream: str) -> tuple[Any, str, asyncio.Task[None], Any]:
    """Serve the LLM proxy on this event loop, so it shares the store with the runners and the algorithm."""
    import uvicorn

    from agentlightning.proxy import create_proxy_app

    app = create_proxy_app(store, upstream)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    )
    task = asyncio.create_task(server.serve(), name="agl-llm-proxy")
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"the LLM proxy failed to start on port {port}")
        await asyncio.sleep(0.01)
    return app, f"http://127.0.0.1:{port}", task, server
