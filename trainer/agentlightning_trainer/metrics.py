"""Per-step training metrics: a rich progress bar, TensorBoard event files, MLflow / W&B when installed, and the
store the run trains against (for the dashboard's Training view)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentlightning.store.base import LightningStore
from agentlightning.types import MetricsRecord

logger = logging.getLogger(__name__)

UPDATE_METRICS: Mapping[str, str] = {
    "loss": "total loss of the update (mean over its optimizer steps)",
    "pg_loss": "policy-gradient loss",
    "kl": "k3 KL to the reference policy (kl_coef > 0)",
    "value_loss": "PPO value loss",
    "clip_frac": "share of loss tokens whose ratio was clipped",
    "dual_clip_frac": "share of loss tokens whose loss the dual clip capped (clip_ratio_c set)",
    "entropy": "policy entropy over the vocabulary at response tokens, aggregated like the loss (entropy_coef > 0)",
    "logprob_mismatch": "mean |learner - served| logprob over loss tokens before the update moved the weights: how "
    "far the serving engine's probabilities are from the learner's (absent without served logprobs)",
    "tis_truncated_frac": "share of loss tokens whose truncated importance weight hit tis_cap (tis_cap set)",
    "grad_norm": "gradient norm before clipping",
    "trained_transitions": "transitions the update trained on",
    "dropped_transitions": "transitions the update could not use",
    # LightningRL's own counts of calls recorded without token ids (any backend; absent when there were none).
    "retokenized": "calls without token ids re-tokenised with the policy's tokenizer (every verdict but failed)",
    "retokenized_trained": "re-tokenised calls trained (usage matched, or any with retokenize='all')",
    "retokenize_drift": "re-tokenised calls whose recorded usage disagrees with the re-tokenised lengths",
    "retokenize_skipped_drift": "drifting calls skipped (retokenize='matching')",
    "retokenize_skipped_no_usage": "calls skipped because no usage was recorded to check them (retokenize='matching')",
    "retokenize_failed": "calls without token ids that could not be re-tokenised (no messages or reply recorded)",
}
"""What the update reports per step (``StepMetrics.extra``; ``update/<name>`` in the loggers): the torch learner's
numbers and the re-tokenisation counts."""


@dataclass
class StepMetrics:
    """What one training step reports."""

    step: int
    reward_mean: float
    reward_ema: float
    all_same_frac: float = field(metadata={"help": "groups whose samples all got the same reward (collapse)"})
    transitions: int
    rollouts: int
    failed_rollouts: int
    policy_version: int
    policy_lag: float
    rollout_s: float
    update_s: float
    skipped: bool = False
    wall_s: float = 0.0
    val_reward: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    staleness: dict[int, int] = field(
        default_factory=dict[int, int],
        metadata={"help": "trained transitions by how many policy versions behind the learner their call was served"},
    )
    stale_groups_dropped: int = field(default=0, metadata={"help": "task groups dropped as older than max_staleness"})
    stale_rollouts_dropped: int = field(default=0, metadata={"help": "rollouts in those groups"})
    runner_idle_frac: float | None = field(
        default=None, metadata={"help": "share of the runners' time in this step spent without a rollout"}
    )
    learner_idle_frac: float | None = field(
        default=None, metadata={"help": "share of this step the learner spent waiting for rollouts"}
    )

    @property
    def logprob_mismatch(self) -> float | None:
        """Mean |learner - served| logprob of this step's update, when its transitions carried served logprobs."""
        return self.extra.get("logprob_mismatch")

    @property
    def entropy(self) -> float | None:
        """The policy's aggregated entropy in this step's update, when ``entropy_coef`` > 0."""
        return self.extra.get("entropy")

    def update_summary(self) -> str:
        """The update's health numbers a user should see every step (mismatch, entropy), or ''."""
        parts: list[str] = []
        if self.logprob_mismatch is not None:
            parts.append(f"logprob mismatch {self.logprob_mismatch:.2g}")
        if self.entropy is not None:
            parts.append(f"entropy {self.entropy:.3g}")
        return ", ".join(parts)

    def flow_summary(self) -> str:
        """Staleness, drops and idle time of this step, as the console shows them, or ''."""
        parts: list[str] = []
        if self.staleness and set(self.staleness) != {0}:
            parts.append("staleness " + " ".join(f"{k}:{v}" for k, v in sorted(self.staleness.items())))
        if self.stale_groups_dropped:
            parts.append(f"{self.stale_groups_dropped} stale group(s) dropped")
        if self.runner_idle_frac is not None:
            parts.append(f"runners idle {self.runner_idle_frac:.0%}")
        if self.learner_idle_frac is not None:
            parts.append(f"learner idle {self.learner_idle_frac:.0%}")
        return ", ".join(parts)

    def scalars(self) -> dict[str, float]:
        """Flat name -> value for loggers."""
        out = {k: float(v) for k, v in asdict(self).items() if isinstance(v, int | float) and k != "step"}
        out.update({f"update/{k}": v for k, v in self.extra.items()})
        out.update({f"staleness/{k}": float(v) for k, v in self.staleness.items()})
        return out


def metrics_record(run_id: str, metrics: StepMetrics, time_ns: int | None = None) -> MetricsRecord:
    """One step as the store keeps it: the loggers' flat scalars (``staleness/<n>``, ``update/<name>``).

    A value that is not finite (a NaN loss) is left out: the store refuses NaN/Infinity, and a gap in one series is
    better than losing the step. ``time_ns`` defaults to now.
    """
    values = {name: value for name, value in metrics.scalars().items() if math.isfinite(value)}
    if metrics.val_reward is not None and math.isfinite(metrics.val_reward):  # validated at this step
        values["val_reward"] = metrics.val_reward
    return MetricsRecord(
        run_id=run_id, step=metrics.step, time=time.time_ns() if time_ns is None else time_ns, values=values
    )


def metrics_run_id(checkpoint_dir: Path | None) -> str:
    """The run id a training run's metrics are stored under: derived from the checkpoint folder when there is one, so
    a resumed run keeps its id (and a step logged again replaces its record), else new for every run."""
    if checkpoint_dir is not None:
        resolved = checkpoint_dir.resolve()
        return f"{resolved.name}-{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class StoreMetricsSink:
    """Writes each step's metrics to the store, where the dashboard reads them; never stops training.

    A store that refuses or fails the write (down, an older server without ``/v1/metrics``) costs the run its
    dashboard series, not its training: the first failure is logged as one warning, later ones at debug level.
    """

    def __init__(self, store: LightningStore, run_id: str, *, timeout_s: float = 30.0) -> None:
        """Send to ``store`` under ``run_id``; one write may take up to ``timeout_s`` (client retries included)."""
        self.store = store
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.failures = 0

    async def send(self, metrics: StepMetrics) -> bool:
        """Store one step's record; False (and a log line) when the store did not take it."""
        try:
            record = metrics_record(self.run_id, metrics)
            async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it can swallow a cancel (gh-86296)
                await self.store.add_metrics([record])
        except Exception as exc:  # the boundary: whatever the store raised, training goes on
            self.failures += 1
            if self.failures == 1:
                logger.warning(
                    "step %d: metrics not written to the store (%s: %s); training continues, but the dashboard's "
                    "Training view will miss steps of run %s (further failures are logged at debug level)",
                    metrics.step, type(exc).__name__, exc, self.run_id,
                )  # fmt: skip
            else:
                logger.debug("step %d: metrics not written to the store: %r", metrics.step, exc)
            return False
        return True


class RunnerUtilisation:
    """Estimates the runner fleet's idle share from rollouts' claim and end times (the algorithm does not see the
    runners): the fleet size is taken as the most rollouts ever seen running at once."""

    def __init__(self) -> None:
        """Start with no rollout seen."""
        self._spans: dict[str, tuple[int, int | None]] = {}
        self.fleet = 0

    def observe(self, rollouts: Sequence[Any]) -> None:
        """Record the (start, end) times in ns of ``Rollout`` objects; later observations of one rollout win."""
        for r in rollouts:
            if r.start_time is not None:
                self._spans[r.rollout_id] = (r.start_time, r.end_time)

    def idle_fraction(self, t0_ns: int, t1_ns: int) -> float | None:
        """Share of runner time in [t0, t1] with no rollout; rollouts without an end still run. Forgets rollouts
        that ended before ``t0``."""
        if t1_ns <= t0_ns:
            return None
        self._spans = {k: v for k, v in self._spans.items() if v[1] is None or v[1] > t0_ns}
        events: list[tuple[int, int]] = []
        busy = 0
        for start, end in self._spans.values():
            stop = t1_ns if end is None else min(end, t1_ns)
            if stop > max(start, t0_ns):
                busy += stop - max(start, t0_ns)
            events += [(start, 1), (end if end is not None else t1_ns, -1)]
        running = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            running += delta
            self.fleet = max(self.fleet, running)
        if self.fleet == 0:
            return None
        return max(0.0, 1.0 - busy / (self.fleet * (t1_ns - t0_ns)))


def group_summary(rewards_by_group: Mapping[str, Sequence[float]]) -> tuple[float, float]:
    """Mean reward over all samples and the fraction of groups whose samples all got the same reward."""
    values = [r for group in rewards_by_group.values() for r in group]
    if not values:
        return 0.0, 0.0
    same = sum(1 for group in rewards_by_group.values() if group and max(group) == min(group))
    return sum(values) / len(values), same / max(1, len(rewards_by_group))


class MetricsLogger:
    """Fans step metrics out to the console (a live progress bar), TensorBoard and optional MLflow / W&B."""

    def __init__(
        self,
        total_steps: int,
        *,
        log_dir: Path | None = None,
        show_progress: bool = True,
        run_name: str = "lightning-rl",
        console: Console | None = None,
        store: LightningStore | None = None,
        run_id: str | None = None,
    ) -> None:
        """Open the sinks; MLflow / W&B are used only when installed and configured by their usual env vars.

        With ``store``, :meth:`log_to_store` writes each step there under ``run_id`` (new when None).
        """
        self.history: list[StepMetrics] = []
        self.store_sink = None if store is None else StoreMetricsSink(store, run_id or metrics_run_id(None))
        self.console = console or Console(stderr=True)
        self._writer: Any = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(log_dir))
        self._mlflow: Any = None
        if importlib.util.find_spec("mlflow") is not None:
            mlflow: Any = importlib.import_module("mlflow")

            if mlflow.get_tracking_uri() and not mlflow.active_run():
                self._mlflow = mlflow
                mlflow.start_run(run_name=run_name)
        self._wandb: Any = None
        if importlib.util.find_spec("wandb") is not None:
            import os

            if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") == "offline":
                wandb: Any = importlib.import_module("wandb")
                self._wandb = wandb.init(project="agent-lightning", name=run_name)
        self._progress: Progress | None = None
        self._task: Any = None
        if show_progress:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "reward {task.fields[reward]:.2f} (ema {task.fields[ema]:.2f}) val {task.fields[val]}"
                    "{task.fields[update]}"
                ),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, reward=0.0, ema=0.0, val="-", update="")

    def __enter__(self) -> MetricsLogger:
        """Start the live progress bar."""
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the progress bar and flush every sink."""
        self.close()

    def log(self, metrics: StepMetrics) -> None:
        """Record one step everywhere."""
        self.history.append(metrics)
        scalars = metrics.scalars()
        if self._writer is not None:
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, metrics.step)
            if metrics.staleness:
                import numpy as np

                lags = np.repeat(list(metrics.staleness), list(metrics.staleness.values()))
                self._writer.add_histogram("staleness", lags, metrics.step, bins="auto")
            self._writer.flush()
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("/", "."): v for k, v in scalars.items()}, step=metrics.step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=metrics.step)
        if self._progress is not None and not self.console.is_terminal:
            # A log file or CI gets no live bar (rich draws it only at the end there): one line per step instead.
            val = self._last_val()
            summary = ", ".join(p for p in (metrics.update_summary(), metrics.flow_summary()) if p)
            self.console.print(
                f"step {metrics.step}/{self._progress.tasks[0].total:.0f}: reward {metrics.reward_mean:.2f} "
                f"(ema {metrics.reward_ema:.2f}), val {'-' if val is None else f'{val:.2f}'}, "
                f"rollouts {metrics.rollout_s:.1f} s, update {metrics.update_s:.1f} s, {metrics.wall_s:.0f} s in"
                f"{f', {summary}' if summary else ''}",
                soft_wrap=True,
            )
        if self._progress is not None:
            val = self._last_val()
            summary = metrics.update_summary()
            self._progress.update(
                self._task,
                completed=metrics.step,
                reward=metrics.reward_mean,
                ema=metrics.reward_ema,
                val="-" if val is None else f"{val:.2f}",
                update=f", {summary}" if summary else "",
            )

    async def log_to_store(self, metrics: StepMetrics) -> None:
        """Write one step to the store the logger was given (nothing without one); a failure only logs."""
        if self.store_sink is not None:
            await self.store_sink.send(metrics)

    def log_validation(self, step: int, reward: float) -> None:
        """Record a validation result (greedy decoding)."""
        if self.history and self.history[-1].step == step:
            self.history[-1].val_reward = reward
        if self._writer is not None:
            self._writer.add_scalar("val_reward", reward, step)
            self._writer.flush()
        if self._mlflow is not None:
            self._mlflow.log_metric("val_reward", reward, step=step)
        if self._wandb is not None:
            self._wandb.log({"val_reward": reward}, step=step)
        if self._progress is not None:
            self._progress.update(self._task, val=f"{reward:.2f}")
            if not self.console.is_terminal:
                self.console.print(f"validation (greedy) at step {step}: {reward:.2f}")

    def warn(self, message: str) -> None:
        """Show a warning on the console and in the log."""
        logger.warning(message)
        self.console.print(f"[yellow]warning:[/yellow] {message}")

    def _last_val(self) -> float | None:
        for m in reversed(self.history):
            if m.val_reward is not None:
                return m.val_reward
        return None

    def close(self) -> None:
        """Stop the progress bar and close every sink (idempotent)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._mlflow is not None:
            self._mlflow.end_run()
            self._mlflow = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
