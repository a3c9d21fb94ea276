"""The whole benchmark suite in one command: ``make bench`` (``.venv/bin/python -m bench``).

1. Side by side with Microsoft agentlightning 0.3.0 (``bench.compare``: installs the peer into ``.venv-peer`` once).
2. Our own figures from every other ``bench/<name>.py`` module, each run with ``--quick`` in its own process so the
   suite stays under ten minutes.
Writes ``bench/RESULTS.md`` with the machine, the load average during the run, both tables, the targets met and
missed, and a profile of each missed target. ``docs/benchmarks.md`` explains every figure.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._util import LoadSampler, Summary, machine_description
from bench.compare import QUICK, ROOT, Comparison, Sizes, markdown_table, run_comparison

BENCH = ROOT / "bench"
RESULTS = BENCH / "RESULTS.md"
# learning_agents: the agents bench.learning's runner processes load, not a benchmark.
NOT_MODULES = {"__init__", "__main__", "_util", "compare", "learning_agents"}
# Extra arguments per module beyond --quick: the learning benchmark's HTTP loop alone takes minutes.
EXTRA_ARGS: dict[str, list[str]] = {"learning": ["--skip-http"]}
# Modules whose framework conflicts with the main environment run in their own (see the Makefile).
INTERPRETERS: dict[str, Path] = {
    "integration_crewai": ROOT / ".venv-crewai" / "bin" / "python",
    # trl pins its own transformers range; it lives in .venv-trl (bench/trl_step.py's docstring builds it).
    "trl_step": ROOT / ".venv-trl" / "bin" / "python",
}
MODULE_TIMEOUT_S = 180.0
# The whole suite should finish within ten minutes; modules run in name order (learning, the slowest, last) and
# each gets at most what is left of this budget, but together never less than OWN_MINIMUM_S: on a machine
# oversubscribed by neighbours the comparison alone can take most of the ten minutes, and a results file without our
# own figures would be worse than a suite that runs a little longer (the total time is in the results).
SUITE_BUDGET_S = 570.0
OWN_MINIMUM_S = 180.0
# Real-model modules: minutes of SmolLM2 on 2 cores even with --quick. They run after the ten-minute part, each with
# its own limit, so that they neither crowd out the others nor get cut off by the suite's budget.
LONG_MODULES: dict[str, float] = {"real_model": 600.0, "trl_step": 900.0}


@dataclass(frozen=True)
class ModuleRun:
    """One own-only benchmark module's quick run."""

    name: str
    purpose: str
    command: str
    seconds: float
    status: str
    output: str


def own_modules() -> list[str]:
    """Every benchmark module in bench/ other than the suite's own files (new ones are picked up)."""
    names = sorted(path.stem for path in BENCH.glob("*.py") if path.stem not in NOT_MODULES)
    return sorted(names, key=lambda name: name == "learning")


def _purpose(name: str) -> str:
    docstring = ast.get_docstring(ast.parse((BENCH / f"{name}.py").read_text())) or ""
    return docstring.splitlines()[0] if docstring else ""


def run_module(name: str, timeout_s: float) -> ModuleRun:
    """``python -m bench.<name> --quick`` in its own process, with a time limit."""
    arguments = ["--quick", *EXTRA_ARGS.get(name, [])]
    python = INTERPRETERS.get(name, Path(sys.executable))
    command = [str(python), "-m", f"bench.{name}", *arguments]
    shown = f"python -m bench.{name} {' '.join(arguments)}"
    if timeout_s < 20:
        return ModuleRun(name, _purpose(name), shown, 0.0, "skipped: the suite's time budget is spent", "")
    if not python.exists():
        return ModuleRun(name, _purpose(name), shown, 0.0, f"skipped: needs {python.parent.parent.name}", "")
    print(f"own: bench.{name} {' '.join(arguments)}", flush=True)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        output = (done.stdout + (f"\n[stderr]\n{done.stderr[-3000:]}" if done.returncode else "")).strip()
        status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        output, status = partial.strip(), f"stopped after {timeout_s:.0f} s (time limit)"
    seconds = time.perf_counter() - began
    return ModuleRun(name, _purpose(name), shown, seconds, status, output)


def _targets_summary(comparison: Comparison) -> list[str]:
    lines: list[str] = []
    for row in comparison.rows:
        if row.target_met is None and not row.target:
            continue
        if row.target_met is None:
            lines.append(f"- {row.label}: target {row.target} — not measured (see notes)")
            continue
        ours = f"{row.ours.median:,.{row.digits}f} {row.unit}" if row.ours else "—"
        ratio = f", {row.ratio:,.2f}x the peer" if row.ratio is not None and row.higher_is_better else ""
        verdict = "met" if row.target_met else "**MISSED**"
        lines.append(f"- {row.label}: {ours}{ratio} — target {row.target}: {verdict}")
    return lines


def write_results(
    comparison: Comparison, modules: Sequence[ModuleRun], machine: dict[str, str], load: Summary, sizes: Sizes
) -> str:
    """The results file's Markdown."""
    cores = machine["cores"]
    parts = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`python -m bench`); what each figure measures: [docs/benchmarks.md]"
        "(../docs/benchmarks.md). Every figure is the median of the runs, with the range (min–max) in brackets.",
        "",
        "## Machine",
        "",
        *(f"- {key}: {value}" for key, value in machine.items()),
        f"- load average (1 min) during the run: median {load.median:.1f}, range {load.low:.1f}–{load.high:.1f} "
        f"on {cores} cores ({load.runs} samples). The machine is shared with other engineers' jobs: with a load "
        f"above {cores} every figure here is slower than on an idle machine, on both sides alike (runs interleave).",
        "",
        f"## Ours vs Microsoft agentlightning 0.3.0 ({sizes.runs} runs each, interleaved)",
        "",
        markdown_table(comparison.rows),
        "",
        "### Targets",
        "",
        *_targets_summary(comparison),
        "",
        "Where the time goes in the missed targets and the suggested fixes: "
        "[docs/benchmarks.md, Missed targets](../docs/benchmarks.md#missed-targets); the profiles are below.",
        "",
    ]
    if comparison.notes:
        parts += ["### Notes", "", *(f"- {note}" for note in comparison.notes), ""]
    if comparison.profiles:
        parts += ["### Profiles", ""]
        for title, text in comparison.profiles.items():
            parts += [f"**{title}**", "", "```text", text, "```", ""]
    if modules:
        parts += [
            "## Our own figures (other bench modules, quick sizes)",
            "",
            "Each module runs with `--quick` (smaller work, fewer rounds than its default) so the whole suite fits "
            "in ten minutes; run a module alone without `--quick` for steadier figures.",
            "",
            "| module | measures | command | time | status |",
            "|---|---|---|---|---|",
            *(f"| {m.name} | {m.purpose} | `{m.command}` | {m.seconds:.0f} s | {m.status} |" for m in modules),
            "",
        ]
        for module in modules:
            parts += [f"### bench.{module.name}", "", "```text", module.output or "(no output)", "```", ""]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite, print the comparison, write bench/RESULTS.md."""
    parser = argparse.ArgumentParser(description="Agent Lightning benchmark suite (ours vs agentlightning 0.3.0).")
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer runs, less work per run")
    parser.add_argument("--skip-own", action="store_true", help="only the side-by-side comparison")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the results (Markdown)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    began = time.perf_counter()
    machine = machine_description()
    sampler = LoadSampler()
    try:
        comparison = run_comparison(sizes)
        modules: list[ModuleRun] = []
        own_deadline = time.perf_counter() + max(SUITE_BUDGET_S - (time.perf_counter() - began), OWN_MINIMUM_S)
        names = [] if args.skip_own else own_modules()
        for name in [n for n in names if n not in LONG_MODULES]:
            modules.append(run_module(name, min(MODULE_TIMEOUT_S, own_deadline - time.perf_counter())))
        for name in [n for n in names if n in LONG_MODULES]:
            modules.append(run_module(name, LONG_MODULES[name]))
    finally:
        load = sampler.stop()
    text = write_results(comparison, modules, machine, load, sizes)
    elapsed = time.perf_counter() - began
    args.output.write_text(text + f"\nWhole suite: {elapsed / 60:.1f} minutes.\n")
    print()
    print(markdown_table(comparison.rows))
    print()
    print("\n".join(_targets_summary(comparison)))
    print(f"\nload average median {load.median:.1f} (range {load.low:.1f}–{load.high:.1f}); {elapsed / 60:.1f} min")
    print(f"written: {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")


if __name__ == "__main__":
    main()
