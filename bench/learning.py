"""Learning benchmark (not a test): wall time and steps until the train reward EMA reaches 0.8 on the tool-choice task.

Run: ``.venv/bin/python -m bench.learning`` (``--quick`` for one seed). ``--settings [args]`` prints instead, per
example, the effect of LightningRL's defaults and options before/after issue 25, 3 seeds (``bench/rl_settings.py``;
its args follow). Two loops, median of 3 seeds each:

* in-process — the policy samples directly, no store, no HTTP (the CI path);
* full HTTP — runners execute the unmodified OpenAI-SDK agent, which calls the LLM proxy, which forwards to the
  policy server process and records spans with token ids into a SQLite store; LightningRL adapts, updates and
  hot-swaps the weights (the ``make train`` path). Target: <= 3 minutes on this machine.

``--async`` compares instead LightningRL's ``mode="sync"`` and ``mode="async"`` (issue 28) through the full HTTP
loop, 3 seeds each in one run, with the agent's tool taking 0.5 s (a simulated slow tool: the agent sleeps after the
model's answer, before scoring) and with no latency. Goal: async >= 1.5x faster with the slow tool, no slower without,
the same final reward. The async runs use the mode's default ``tis_cap=2.0`` (truncated importance sampling,
decoupled PPO: the ratio from the learner's weights, the served/learner importance weight capped); ``--tis-cap off``
turns it off, ``--tis-cap X`` sets another cap; ``--tools slow|none`` runs one latency;
``--runners N`` and ``--runner-processes P`` size the runner fleet (both modes alike; default 1 process of
``(max_staleness + 1) x tasks_per_step x samples_per_task`` workers, 384 at the defaults: the fleet
``docs/algorithm.md`` prescribes for async training, of which sync mode keeps 192 busy).
``--agent http`` makes the agent's chat call over plain ``http.client`` instead of the OpenAI SDK, whose client code
is most of the runner process's CPU here.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console
from rich.table import Table

from agentlightning.trainer import Trainer
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.inprocess import train_in_process
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.metrics import StepMetrics
from agentlightning_trainer.quickstart.agent import tool_choice_agent
from bench.learning_agents import SLOW_TOOL_S

THRESHOLD = 0.8
TARGET_HTTP_S = 180.0


def _config(seed: int, max_steps: int, **overrides: object) -> LightningRLConfig:
    return LightningRLConfig.model_validate(
        {
            "policy": PolicySpec(words=tool_choice.vocabulary()),
            "steps": max_steps,
            "seed": seed,
            "val_every": 10_000,
            "stop_at_reward": THRESHOLD,
            **overrides,
        }
    )


@dataclass
class Run:
    """One training run: wall seconds and steps to reward EMA 0.8, and where the time of a step went."""

    seconds: float
    steps: int | None
    rollout_s: float  # mean per step: rollouts through reading their transitions
    update_s: float  # mean per step: update and weight publish
    cpu_s: float  # CPU seconds per step, this process and its children (the policy server)
    load: tuple[float, float]  # 1-minute load average at the start and at the end (other work on the machine)

    def breakdown(self) -> str:
        """Per-step figures for the console."""
        return (
            f"{self.rollout_s:.2f} s rollouts + {self.update_s:.2f} s update per step, "
            f"{self.cpu_s:.2f} CPU-s per step, load {self.load[0]:.1f} -> {self.load[1]:.1f}"
        )


class _Meter:
    """Wall and CPU time (this process and its finished children) and the load average around a run."""

    def __enter__(self) -> _Meter:
        self.load0 = os.getloadavg()[0]
        self.wall0 = time.perf_counter()
        self.cpu0 = _cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.wall0
        self.cpu_s = _cpu_s() - self.cpu0
        self.load = (self.load0, os.getloadavg()[0])


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def in_process(seed: int, max_steps: int) -> Run:
    """Steps and seconds to reward EMA 0.8 without HTTP."""
    with _Meter() as meter:
        result = train_in_process(
            _config(seed, max_steps), tool_choice.tasks(), None, messages=tool_choice.messages, score=tool_choice.score
        )
    return _run(meter, result.history, result.steps_to(THRESHOLD))


def full_http(seed: int, max_steps: int, epochs: int) -> Run:
    """Steps and seconds to reward EMA 0.8 through runner → proxy → policy server, SQLite store, policy server start."""
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp:
        algorithm = LightningRL(_config(seed, max_steps, epochs=epochs), run_dir=Path(tmp), show_progress=False)
        with _Meter() as meter:
            Trainer(algorithm, store=Path(tmp) / "store.db", n_runners=48).fit(tool_choice_agent, tool_choice.tasks())
    reached = next((m.step for m in algorithm.history if m.reward_ema >= THRESHOLD), None)
    return _run(meter, algorithm.history, reached)


@dataclass
class ModeRun:
    """One sync-or-async HTTP run: wall time to the threshold, steps, the last steps' reward and idle shares."""

    seconds: float  # from launch (runner processes, policy server) until the step that reached the threshold ended
    fit_s: float  # the whole run: also the shutdown after that step (in-flight rollouts, server, runner processes)
    steps: int | None
    final_reward: float  # mean train reward of the last 5 steps
    dropped: int  # stale groups dropped
    runner_idle: float  # mean runner idle share per step
    learner_idle: float  # mean learner idle share per step
    load: tuple[float, float]


class _TimedHistory(list[StepMetrics]):
    """The algorithm's history, with the time each step's record arrived (when the threshold step ended)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def append(self, record: StepMetrics) -> None:
        """Note the time, then keep the record."""
        self.at.append(time.perf_counter())
        super().append(record)


def fleet_size(config: LightningRLConfig) -> int:
    """Runner workers that can run every rollout async mode keeps in flight: a sleeping tool costs a thread, not a
    core, and a smaller fleet would cap how far collection runs ahead of the learner."""
    return (config.max_staleness + 1) * config.tasks_per_step * config.samples_per_task


def http_mode(
    seed: int,
    max_steps: int,
    epochs: int,
    mode: str,
    slow_tool: bool,
    max_staleness: int,
    tis_cap: float | Literal["off"] | None = None,
    runners: int | None = None,
    processes: int = 1,
    client: Literal["sdk", "http"] = "sdk",
) -> ModeRun:
    """Seconds to reward EMA 0.8 through the full HTTP loop in ``mode``, with or without the slow tool.

    The runners are one ``agl runner`` process on the run's SQLite store, as a fleet is deployed: in the trainer's
    own process their Python work shares the GIL with the learner, which then updated ~3x slower while rollouts ran
    (measured 0.77 s -> 2.44 s per update, 192 runner threads). ``runners`` None: the async fleet of
    :func:`fleet_size`, in both modes.
    """
    if client == "http":
        agent = "bench.learning_agents:http_slow_tool_agent" if slow_tool else "bench.learning_agents:http_agent"
    else:
        agent = (
            "bench.learning_agents:slow_tool_agent"
            if slow_tool
            else "agentlightning_trainer.quickstart.agent:tool_choice_agent"
        )
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        store = Path(tmp) / "store.db"
        # tis_cap None: the config's default for the mode (2.0 for async); "off": no importance correction.
        cap = {} if tis_cap is None else {"tis_cap": None if tis_cap == "off" else tis_cap}
        config = _config(seed, max_steps, epochs=epochs, mode=mode, max_staleness=max_staleness, **cap)
        runners = fleet_size(config) if runners is None else runners
        algorithm = LightningRL(config, run_dir=Path(tmp), show_progress=False)
        timed = algorithm.history = _TimedHistory()
        with _Meter() as meter:
            command = [sys.executable, "-m", "agentlightning.cli", "runner", "--store", str(store), "--agent", agent]
            command += ["--workers", str(runners // processes), "--processes", str(processes), "--quiet"]
            root = Path(__file__).resolve().parents[1]
            fleet = subprocess.Popen(command, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            try:
                Trainer(algorithm, store=store, role="algorithm").fit(None, tool_choice.tasks())
            finally:
                fleet.terminate()
                fleet.wait(timeout=60)
    history = algorithm.history
    at = next((i for i, m in enumerate(history) if m.reward_ema >= THRESHOLD), None)
    reached = None if at is None else history[at].step
    last = history[-5:]
    n = max(1, len(history))
    return ModeRun(
        seconds=meter.seconds if at is None else timed.at[at] - meter.wall0,
        fit_s=meter.seconds,
        steps=reached,
        final_reward=sum(m.reward_mean for m in last) / max(1, len(last)),
        dropped=sum(m.stale_groups_dropped for m in history),
        runner_idle=sum(m.runner_idle_frac or 0.0 for m in history) / n,
        learner_idle=sum(m.learner_idle_frac or 0.0 for m in history) / n,
        load=meter.load,
    )


def compare_modes(
    seeds: list[int],
    max_steps: int,
    epochs: int,
    max_staleness: int,
    console: Console,
    *,
    tis_cap: float | Literal["off"] | None = None,
    tools: str = "both",
    runners: int | None = None,
    processes: int = 1,
    client: Literal["sdk", "http"] = "sdk",
) -> None:
    """Sync vs async, with and without the slow tool, every seed; prints a table and the speed-ups."""
    table = Table(title=f"sync vs async LightningRL: wall s to train reward EMA >= {THRESHOLD} (tool choice, HTTP)")
    for column in ("tool", "mode", "seed", "steps", "wall s", "whole fit s", "final reward", "stale dropped",
                   "runner idle", "learner idle", "load"):  # fmt: skip
        table.add_column(column)
    times: dict[tuple[bool, str], list[float]] = {}
    fits: dict[tuple[bool, str], list[float]] = {}
    for slow in {"both": (True, False), "slow": (True,), "none": (False,)}[tools]:
        tool = f"{SLOW_TOOL_S} s" if slow else "none"
        # Seed by seed, sync then async: load from other work on the machine drifts, and reaches both alike.
        for seed in seeds:
            for mode in ("sync", "async"):
                cap = tis_cap if mode == "async" else None
                r = http_mode(seed, max_steps, epochs, mode, slow, max_staleness, cap, runners, processes, client)
                label = mode if mode == "sync" or tis_cap is None else f"async, tis_cap {tis_cap}"
                console.print(
                    f"tool {tool}, {label}, seed {seed}: {r.steps} steps, {r.seconds:.1f} s ({r.fit_s:.1f} s with "
                    f"the shutdown), final reward {r.final_reward:.2f}, {r.dropped} stale groups dropped, runner idle "
                    f"{r.runner_idle:.0%}, "
                    f"learner idle {r.learner_idle:.0%}, load {r.load[0]:.1f}-{r.load[1]:.1f}"
                )
                table.add_row(
                    tool, label, str(seed), str(r.steps), f"{r.seconds:.1f}", f"{r.fit_s:.1f}", f"{r.final_reward:.2f}",
                    str(r.dropped),
                    f"{r.runner_idle:.0%}", f"{r.learner_idle:.0%}", f"{r.load[0]:.1f}-{r.load[1]:.1f}",
                )  # fmt: skip
                times.setdefault((slow, mode), []).append(r.seconds if r.steps is not None else float("inf"))
                fits.setdefault((slow, mode), []).append(r.fit_s if r.steps is not None else float("inf"))
    medians = {key: statistics.median(values) for key, values in times.items()}
    fit_medians = {key: statistics.median(values) for key, values in fits.items()}
    for (slow, mode), median in medians.items():
        table.add_row(f"{SLOW_TOOL_S} s" if slow else "none", f"[bold]{mode}", "median", "", f"[bold]{median:.1f}",
                      f"{fit_medians[(slow, mode)]:.1f}", "", "", "", "", "")  # fmt: skip
    console.print(table)
    for slow, goal in ((True, 1.5), (False, 1.0)):
        if (slow, "async") not in medians:
            continue
        speedup = medians[(slow, "sync")] / medians[(slow, "async")]
        whole = fit_medians[(slow, "sync")] / fit_medians[(slow, "async")]
        label = f"tool {SLOW_TOOL_S} s" if slow else "no tool latency"
        verdict = "met" if speedup >= goal else "NOT met"
        console.print(
            f"{label}: async is {speedup:.2f}x sync (median wall time to the threshold; {whole:.2f}x counting the "
            f"shutdown after it); goal >= {goal}x: {verdict}"
        )


def _tis_cap(text: str) -> float | Literal["off"]:
    """``--tis-cap`` value: a cap >= 1, or "off" for none."""
    return "off" if text == "off" else float(text)


def _run(meter: _Meter, history: list[StepMetrics], reached: int | None) -> Run:
    n = max(1, len(history))
    return Run(
        seconds=meter.seconds,
        steps=reached,
        rollout_s=sum(m.rollout_s for m in history) / n,
        update_s=sum(m.update_s for m in history) / n,
        cpu_s=meter.cpu_s / n,
        load=meter.load,
    )


def main() -> None:
    """Run both loops over the seeds and print medians (or, with ``--settings``, bench/rl_settings.py)."""
    if "--settings" in sys.argv[1:]:
        from bench import rl_settings

        sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != "--settings")]
        rl_settings.main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one seed instead of three")
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--http-epochs", type=int, default=3, help="epochs per step of the HTTP loop (quickstart: 3)")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-in-process", action="store_true")
    parser.add_argument("--async", dest="compare_async", action="store_true", help="sync vs async LightningRL")
    parser.add_argument("--max-staleness", type=int, default=1, help="max_staleness of the async runs")
    parser.add_argument(
        "--tis-cap", type=_tis_cap, default=None, help="tis_cap of the async runs: a number or 'off' (default: 2.0)"
    )
    parser.add_argument("--tools", choices=("both", "slow", "none"), default="both", help="tool latencies to run")
    parser.add_argument(
        "--runners", type=int, default=None, help="runner workers of both modes (default: (max_staleness + 1) x 192)"
    )
    parser.add_argument("--runner-processes", type=int, default=1, help="runner processes the workers are split over")
    parser.add_argument(
        "--agent", choices=("sdk", "http"), default="sdk",
        help="the agent's chat client: the OpenAI SDK (default, the quickstart agent) or plain http.client",
    )  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    console = Console()
    seeds = [0] if args.quick else [0, 1, 2]
    if args.compare_async:
        compare_modes(
            seeds, args.max_steps, args.http_epochs, args.max_staleness, console, tis_cap=args.tis_cap,
            tools=args.tools, runners=args.runners, processes=args.runner_processes, client=args.agent,
        )  # fmt: skip
        return
    loops: dict[str, Callable[[int], Run]] = {}
    if not args.skip_in_process:
        loops["in-process, 1 epoch"] = lambda s: in_process(s, args.max_steps)
    if not args.skip_http:
        loops[f"HTTP, {args.http_epochs} epochs"] = lambda s: full_http(s, args.max_steps, args.http_epochs)
    table = Table(title=f"GRPO steps and wall time to train reward EMA >= {THRESHOLD} (tool choice)")
    for column in ("loop", "seed", "steps", "wall s", "s/step", "CPU s/step", "load"):
        table.add_column(column)
    for name, run in loops.items():
        times: list[float] = []
        steps: list[int] = []
        for seed in seeds:
            result = run(seed)
            console.print(f"{name} seed {seed}: {result.steps} steps, {result.seconds:.1f} s ({result.breakdown()})")
            table.add_row(
                name, str(seed), str(result.steps), f"{result.seconds:.1f}",
                f"{result.rollout_s + result.update_s:.2f}", f"{result.cpu_s:.2f}",
                f"{result.load[0]:.1f}-{result.load[1]:.1f}",
            )  # fmt: skip
            times.append(result.seconds if result.steps is not None else float("inf"))
            steps.append(result.steps if result.steps is not None else 10**9)
        med_t, med_s = statistics.median(times), statistics.median(steps)
        shown = "not reached" if med_s >= 10**9 else str(med_s)
        table.add_row(f"[bold]{name}", "median", shown, f"[bold]{med_t:.1f}", "", "", "")
    console.print(table)
    console.print(
        f"target for the full HTTP loop: <= {TARGET_HTTP_S:.0f} s on a quiet 2-core machine; the load average shows "
        "what else ran (wall time stretches with it; CPU-s per step does not)"
    )


if __name__ == "__main__":
    main()
