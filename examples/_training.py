"""Training shared by the examples: CPU and GPU settings, and one ``Trainer.fit`` run with its outcome."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from agentlightning import Trainer
from agentlightning.store import LightningStore, open_store
from agentlightning_trainer import LightningRL, LightningRLConfig, PolicySpec


def default_run_dir(name: str) -> Path:
    """``runs/<name>-<timestamp>``: where a run keeps its checkpoints, logs and database when none is given."""
    return Path("runs") / time.strftime(f"{name}-%Y%m%d-%H%M%S")


def tiny_gpt_words(
    texts: Iterable[str], *, whole: Iterable[str] = (), pattern: str = r"[A-Za-z]+", spaced: bool = False
) -> tuple[str, ...]:
    """Whole-word tokens for the tiny GPT: ``whole`` first (a tool name or a query as one token, so that a random
    policy can hit it), then each word (``pattern``) of ``texts`` longer than one letter, with ``spaced`` also with
    its leading space (as a BPE tokenizer keeps it). Only the task's own words: each extra token is one more wrong
    reply a random policy can sample."""
    words: dict[str, None] = dict.fromkeys(whole)
    for text in texts:
        for word in re.findall(pattern, text):
            if len(word) > 1:
                if spaced:
                    words.setdefault(" " + word)
                words.setdefault(word)
    return tuple(words)


def cpu_config(
    words: tuple[str, ...], *, steps: int, seed: int, run_dir: Path | None, **settings: Any
) -> LightningRLConfig:
    """Tiny-GPT settings for a 2-core machine (``settings`` override them); checkpoints and logs under ``run_dir``.

    Rollouts (whole agent runs) cost far more than updates, so each step's batch (8 tasks x 16 samples) is used
    twice, in mini-batches of 32 transitions.
    """
    policy = PolicySpec(
        words=words, max_seq_len=settings.pop("max_seq_len", 256), reply_words=settings.pop("reply_words", None)
    )
    defaults: dict[str, Any] = {
        "policy": policy,
        "steps": steps,
        "seed": seed,
        "tasks_per_step": 8,
        "samples_per_task": 16,
        "epochs": 2,
        "mini_batch_size": 32,
        "val_every": 10,
        "checkpoint_dir": None if run_dir is None else run_dir / "checkpoints",
        "log_dir": None if run_dir is None else run_dir / "tensorboard",
    }
    return LightningRLConfig(**(defaults | settings))


def gpu_config(
    model: str, *, backend: str, steps: int, seed: int = 0, run_dir: Path, **settings: Any
) -> LightningRLConfig:
    """Settings for a Hugging Face model on a GPU (``settings`` override them); validated here, run on the GPU."""
    defaults: dict[str, Any] = {
        "backend": backend,
        "policy": PolicySpec(kind="hf", hf_model=model, model_name=Path(model).name or model),
        "steps": steps,
        "seed": seed,
        "tasks_per_step": 16,
        "samples_per_task": 8 if backend == "verl" else 16,
        "lr": 1e-6,
        "checkpoint_dir": None if backend == "verl" else run_dir / "checkpoints",
    }
    return LightningRLConfig(**(defaults | settings))


@dataclass
class TrainOutcome:
    """What a training run produced."""

    algorithm: LightningRL
    store: LightningStore
    val_before: float
    val_after: float
    wall_s: float


def fit(
    config: LightningRLConfig,
    agent: Any,
    train_tasks: list[dict[str, Any]],
    val_tasks: list[dict[str, Any]],
    *,
    instrumentation: Any,
    run_dir: Path,
    store: LightningStore | str = ":memory:",
    n_runners: int = 64,
    runner_processes: int = 1,
    show_progress: bool = True,
    console: Console | None = None,
) -> TrainOutcome:
    """Fit ``agent`` with LightningRL (torch backend, or verl when configured); report validation reward.

    ``instrumentation`` is the example's integration module; it is installed for the run only (and first thing in
    each of the ``runner_processes - 1`` extra runner processes, which need a store file: ``:memory:`` becomes
    ``run_dir/store.db``).
    """
    if config.policy.kind == "tiny_gpt":
        import torch

        torch.set_num_threads(1)  # the policy server, the agents and the learner share the CPU's cores
    console = console or Console()
    run_dir.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {"run_dir": run_dir, "console": console, "show_progress": show_progress}
    if config.backend == "verl":
        from agentlightning_trainer.verl import VerlLightningRL

        algorithm: LightningRL = VerlLightningRL(config, **kwargs)
    else:
        algorithm = LightningRL(config, **kwargs)
    if runner_processes > 1 and store == ":memory:":
        store = str(run_dir / "store.db")
    opened = open_store(store)
    instrumentation.instrument()
    started = time.perf_counter()
    try:
        trainer = Trainer(
            algorithm,
            store=opened,
            n_runners=n_runners,
            console=console,
            runner_processes=runner_processes,
            runner_setup=(instrumentation.instrument,),
        )
        trainer.fit(agent, train_tasks, val_tasks)
    finally:
        instrumentation.uninstrument()
    val = algorithm.val_history
    return TrainOutcome(
        algorithm=algorithm,
        store=opened,
        val_before=val[0][1] if val else float("nan"),
        val_after=val[-1][1] if val else float("nan"),
        wall_s=time.perf_counter() - started,
    )
