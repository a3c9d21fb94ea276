"""LightningRL on verl: the same loop as the torch backend, with verl's actor update and vLLM replicas.

Each step: publish an ``LLM`` resource pointing at our LLM proxy → enqueue every task ``samples_per_task`` times
(one group id per task) → the agents call the proxy, which asks the vLLM replicas (through :mod:`.router`) for
token ids and logprobs and records spans → adapter → rollout-level GRPO advantages (ours) → verl batch → verl's
actor update → new weights pushed into the replicas → policy version bumped (the router stamps it on answers).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentlightning.proxy.server import ServedApp, ServedProxy, serve_app, start_proxy
from agentlightning.store.base import LightningStore
from agentlightning.types import Transition
from agentlightning_trainer.config import LightningRLConfig
from agentlightning_trainer.inprocess import with_advantages
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.verl.settings import VerlSettings, check_verl_config

if TYPE_CHECKING:
    from agentlightning_trainer.retokenize import ChatRetokenizer
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


async def _checksum(engine: VerlEngine) -> float:
    """The actor's parameter checksum, or NaN (logged) when verl's worker internals moved."""
    try:
        return await asyncio.to_thread(engine.actor_checksum)
    except Exception:
        logger.exception("could not read the actor's parameter checksum")
        return float("nan")


def verl_retokenizer(tokenizer: Any) -> ChatRetokenizer | None:
    """The retokenizer of calls recorded without token ids, over the HF tokenizer verl's vLLM replicas serve with.

    None (logged) when the tokenizer has no chat template: such calls then train nothing, as with ``retokenize='off'``.
    """
    from agentlightning_trainer.retokenize import ChatRetokenizer
    from agentlightning_trainer.torch_backend.hf_tokenizer import HFChatTokenizer

    try:
        return ChatRetokenizer(HFChatTokenizer(tokenizer))
    except ValueError as exc:
        logger.warning("calls recorded without token ids cannot be re-tokenised: %s", exc)
        return None


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
    if cfg.retokenize != "off" and algorithm.adapter.retokenizer is None and engine.tokenizer is not None:
        algorithm.adapter.retokenizer = verl_retokenizer(engine.tokenizer)
    router = ReplicaRouter(engine.addresses, served_model=engine.served_model)
    router.policy_version = algorithm.version

    async def update(transitions: list[Transition]) -> dict[str, float]:
        rows, info = with_advantages(transitions, cfg)
        if not rows:  # every group tied and dropped: no step, the served weights stay current
            return info
        version = algorithm.version + 1
        extra = await asyncio.to_thread(engine.train_step, rows, version) | info
        algorithm.version = router.policy_version = version
        if record_checksums is not None:
            record_checksums.append(await _checksum(engine))
        return extra

    served_router: ServedApp | None = None
    proxy: ServedProxy | None = None
    try:
        await router.discover_served_model()
        served_router = await serve_app(create_router_app(router), name="agl-vllm-router")
        proxy = await start_proxy(
            store, served_router.url, host=settings.proxy_host, url_host=_reachable_host(settings.proxy_host)
        )
        replicas = f"{len(router.bases)} vLLM replica(s) {router.bases}"
        algorithm.console.print(f"verl: {replicas} behind the proxy {proxy.url}")
        if record_checksums is not None:
            record_checksums.append(await _checksum(engine))
        await algorithm._train_steps(store, train_tasks, val_tasks, proxy, update, rng=random.Random(cfg.seed))
    finally:
        if proxy is not None:
            await proxy.stop()
        if served_router is not None:
            await served_router.stop()
        await asyncio.to_thread(engine.stop)
