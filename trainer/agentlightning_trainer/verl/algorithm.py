"""LightningRL on verl: the same loop as the torch backend, with verl's actor update and vLLM replicas.

Each step: publish an ``LLM`` resource pointing at our LLM proxy → enqueue every task ``samples_per_task`` times
(one group id per task) → the agents call the proxy, which asks the vLLM replicas (through :mod:`.router`) for
token ids and logprobs and records spans → adapter → rollout-level GRPO advantages (ours) → verl batch → verl's
actor update → new weights pushed into the replicas → policy version bumped (the router stamps it on answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentlightning.store.base import LightningStore
from agentlightning_trainer.config import LightningRLConfig
from agentlightning_trainer.inprocess import with_advantages
from agentlightning_trainer.lightning_rl import LightningRL, collect_batch
from agentlightning_trainer.metrics import MetricsLogger, StepMetrics, group_summary
from agentlightning_trainer.verl.settings import VerlSettings, check_verl_config

if TYPE_CHECKING:
    from agentlightning_trainer.verl.engine import VerlEngine

logger = logging.getLogger(__name__)


class VerlLightningRL(LightningRL):
    """LightningRL with ``backend='verl'``: GPU training with verl, rollouts served by verl's vLLM replicas."""

    def __init__(self, config: LightningRLConfig, *, verl: VerlSettings | None = None, **kwargs: Any) -> None:
        """``verl`` holds the cluster shape and engine switches; ``kwargs`` are :class:`LightningRL`'s.

        The config is checked for verl now (GRPO, a Hugging Face model), before any GPU work starts.
        """
        if config.backend != "verl":
            config = LightningRLConfig.model_validate({**config.model_dump(), "backend": "verl"})
        check_verl_config(config)
        # LightningRL's constructor accepts only its torch backend; it gets a torch twin, then the real config.
        super().__init__(config.model_copy(update={"backend": "torch"}), **kwargs)
        self.config = config
        self.verl_settings = verl or VerlSettings()
        self.engine: VerlEngine | None = None
        self.checksums: list[float] = []

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Train for ``config.steps`` steps (or until ``stop_at_reward``) with verl."""
        await run_verl(self, store, train_tasks, val_tasks, self.verl_settings, record_checksums=self.checksums)


async def _serve(app: Any, host: str, name: str) -> tuple[str, asyncio.Task[None], Any]:
    """Serve an ASGI app on this event loop on a free port; returns its base URL."""
    import uvicorn

    from agentlightning_trainer.policy_server import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve(), name=name)
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"{name} failed to start on {host}:{port}")
        await asyncio.sleep(0.01)
    return f"http://{_reachable_host(host)}:{port}", task, server


def _reachable_host(host: str) -> str:
    """The address others use for a server bound to ``host``: this node's IP when bound to every interface."""
    if host not in ("0.0.0.0", "::"):
        return host
    try:
        import ray

        return str(ray.util.get_node_ip_address())  # the address the Ray cluster knows this node by
    except Exception:  # no ray: the host name's address
        import socket

        return socket.gethostbyname(socket.gethostname())


async def _stop(task: asyncio.Task[None], server: Any) -> None:
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _checksum(engine: VerlEngine) -> float:
    """The actor's parameter checksum, or NaN (logged) when verl's worker internals moved."""
    try:
        return await asyncio.to_thread(engine.actor_checksum)
    except Exception:
        logger.exception("could not read the actor's parameter checksum")
        return float("nan")


async def run_verl(
    algorithm: LightningRL,
    store: LightningStore,
    train_tasks: Sequence[Any] | None,
    val_tasks: Sequence[Any] | None,
    settings: VerlSettings | None = None,
    *,
    record_checksums: list[float] | None = None,
) -> None:
    """Run ``algorithm`` (its config, adapter, history) on verl; ``record_checksums`` gets the actor checksums.

    When ``record_checksums`` is a list, the actor's parameter checksum is appended before the first step and after
    every update (the smoke test's proof that weights changed); it costs one pass over the parameters each time.
    """
    import random

    from agentlightning.proxy import create_proxy_app, flush_proxy_spans
    from agentlightning_trainer.inprocess import pick_tasks
    from agentlightning_trainer.verl.engine import VerlEngine
    from agentlightning_trainer.verl.router import ReplicaRouter, create_router_app

    if not train_tasks:
        raise ValueError("LightningRL needs training tasks: trainer.fit(agent, train_tasks, val_tasks)")
    cfg = algorithm.config
    settings = settings or VerlSettings()
    engine = VerlEngine(cfg, settings)
    if isinstance(algorithm, VerlLightningRL):
        algorithm.engine = engine
    engine.connect()  # ray.init belongs on the main thread (signal handlers); the rest runs in a worker thread
    await asyncio.to_thread(engine.start)
    router = ReplicaRouter(engine.addresses, served_model=engine.served_model)
    router.policy_version = algorithm.version
    await router.discover_served_model()
    router_url, router_task, router_server = await _serve(create_router_app(router), "127.0.0.1", "agl-vllm-router")
    proxy_app = create_proxy_app(store, router_url)
    proxy_url, proxy_task, proxy_server = await _serve(proxy_app, settings.proxy_host, "agl-llm-proxy")
    algorithm.console.print(f"verl: {len(router.bases)} vLLM replica(s) {router.bases} behind the proxy {proxy_url}")
    if record_checksums is not None:
        record_checksums.append(await _checksum(engine))
    rng = random.Random(cfg.seed)
    ema = 0.0
    metrics = MetricsLogger(
        cfg.steps, log_dir=cfg.log_dir, show_progress=algorithm.show_progress, console=algorithm.console
    )
    try:
        with metrics:
            if val_tasks:
                before = await algorithm._validate(store, val_tasks, proxy_url, proxy_app)
                algorithm.val_history.append((0, before))
                metrics.log_validation(0, before)
            for step in range(1, cfg.steps + 1):
                t0 = time.perf_counter()
                chosen = pick_tasks(rng, train_tasks, cfg.tasks_per_step)
                rollouts = await algorithm._run_rollouts(store, chosen, "train", proxy_url, cfg.temperature, step)
                await flush_proxy_spans(proxy_app)
                batch = await collect_batch(store, rollouts, algorithm.adapter, max_prompt_tokens=cfg.max_prompt_tokens)
                rollout_s = time.perf_counter() - t0
                reward_mean, all_same = group_summary(batch.rewards_by_group)
                ema = reward_mean if step == 1 else cfg.ema_decay * ema + (1 - cfg.ema_decay) * reward_mean
                t1 = time.perf_counter()
                extra: dict[str, float] = {}
                lag = 0.0
                skipped = not batch.transitions
                if skipped:
                    metrics.warn(f"step {step}: skipped, {await algorithm._diagnose(store, batch)}")
                else:
                    version = algorithm.version
                    lag = sum(version - (t.policy_version or 0) for t in batch.transitions) / len(batch.transitions)
                    rows = with_advantages(batch.transitions, cfg)
                    extra = await asyncio.to_thread(engine.train_step, rows, version + 1)
                    algorithm.version = router.policy_version = version + 1
                    if record_checksums is not None:
                        record_checksums.append(await _checksum(engine))
                record = StepMetrics(
                    step=step,
                    reward_mean=reward_mean,
                    reward_ema=ema,
                    all_same_frac=all_same,
                    transitions=len(batch.transitions),
                    rollouts=len(rollouts),
                    failed_rollouts=batch.failed,
                    policy_version=algorithm.version,
                    policy_lag=lag,
                    rollout_s=rollout_s,
                    update_s=time.perf_counter() - t1,
                    skipped=skipped,
                    extra=extra,
                )
                algorithm.history.append(record)
                metrics.log(record)
                stop = cfg.stop_at_reward is not None and ema >= cfg.stop_at_reward
                if val_tasks and (step % cfg.val_every == 0 or step == cfg.steps or stop):
                    val = await algorithm._validate(store, val_tasks, proxy_url, proxy_app)
                    algorithm.val_history.append((step, val))
                    metrics.log_validation(step, val)
                if stop:
                    break
    finally:
        await _stop(proxy_task, proxy_server)
        await _stop(router_task, router_server)
        await asyncio.to_thread(engine.stop)
