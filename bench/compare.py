"""Side by side with Microsoft agentlightning 0.3.0 (the peer), on the same machine in one run.

Run: ``.venv/bin/python -m bench.compare`` for this table alone (``python -m bench`` runs it with the rest of the
suite and writes ``bench/RESULTS.md``). The peer is installed from PyPI into its own virtual environment
``.venv-peer`` on first use (~800 MB; skipped when present). Measures, each the median of several runs (min–max):

1. store ingest: spans/s in batches of 100 into each side's default store (ours SQLite, durable; theirs in memory);
2. full rollout cycle (enqueue -> claim -> 10 spans -> complete) with 1, 16 and 64 concurrent workers, in process
   and over HTTP (each side's ``agl store`` server in its own process, each side's client);
3. tracer overhead: microseconds of the agent's thread per LLM-call span;
4. footprint: ``import agentlightning`` time and the installed size of a fresh venv with only the package.

The two sides run in two long-lived worker processes (``bench/peer/ours.py``, ``bench/peer/theirs.py``) whose runs
are interleaved (ours, theirs; then theirs, ours; ...) so that a neighbour's load hits both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._util import SideWorker, Summary, free_port, process_cpu_s, server_process, summarize, tree_bytes

ROOT = Path(__file__).resolve().parent.parent
PEER_REQUIREMENT = "agentlightning==0.3.0"
PEER_VENV = ROOT / ".venv-peer"
CORE_VENV = ROOT / ".venv-core"  # just ``pip install ./core``: our footprint, measured like the peer's
EMPTY_VENV = ROOT / ".venv-empty"  # the baseline both sizes are measured against
# Keeps the peer's worker from spending ~15 s of each start retrying a download of LiteLLM's model price list when
# offline; it changes no measured code path. The import time is measured without it (the user's default).
PEER_QUIET_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
MB = 1_000_000


@dataclass(frozen=True)
class Sizes:
    """Work per run and runs per figure."""

    runs: int = 5
    ingest_spans: int = 10_000
    cycles: int = 320
    http_cycles: int = 64  # the peer's server does ~10-20 cycles/s here: keeps the suite within ten minutes
    tracer_spans: int = 2_000
    import_runs: int = 5


QUICK = Sizes(runs=2, ingest_spans=2_000, cycles=128, http_cycles=64, tracer_spans=500, import_runs=2)


@dataclass(frozen=True)
class Row:
    """One compared figure: both sides' summaries and whether more is better."""

    label: str
    unit: str
    ours: Summary | None
    theirs: Summary | None
    higher_is_better: bool
    target: str = ""
    target_met: bool | None = None
    digits: int = 0
    ours_cpu: Summary | None = None  # the same figure per CPU second (or CPU µs), less sensitive to a busy machine
    theirs_cpu: Summary | None = None

    @property
    def ratio(self) -> float | None:
        """How many times better ours is (>1 = ours better), from the wall-clock medians."""
        return _better(self.ours, self.theirs, self.higher_is_better)

    @property
    def cpu_ratio(self) -> float | None:
        """How many times better ours is per CPU time, from the medians."""
        return _better(self.ours_cpu, self.theirs_cpu, self.higher_is_better)


def _better(ours: Summary | None, theirs: Summary | None, higher_is_better: bool) -> float | None:
    if ours is None or theirs is None or min(ours.median, theirs.median) <= 0:
        return None
    return ours.median / theirs.median if higher_is_better else theirs.median / ours.median


@dataclass
class Comparison:
    """Everything the comparison measured, plus notes and profiles for the results file."""

    rows: list[Row] = field(default_factory=list[Row])
    notes: list[str] = field(default_factory=list[str])
    profiles: dict[str, str] = field(default_factory=dict[str, str])


# --- environments ------------------------------------------------------------------------------------------------
def _base_python() -> str:
    # The interpreter our .venv was made from, so both venvs (and the empty baseline) share one Python.
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def _pip(venv: Path, *arguments: str) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *arguments], capture_output=True, text=True
    )
    if done.returncode != 0:  # pip's own warnings are noise on success; on failure they are the explanation
        raise RuntimeError(f"pip install {' '.join(arguments)} failed in {venv}:\n{done.stdout}{done.stderr}")


def _ensure_venv(venv: Path, stamp: str, install: Callable[[], None], *, fresh: bool = False) -> None:
    """Install into ``venv`` unless it was installed with ``stamp``; ``fresh`` rebuilds it from nothing first."""
    marker = venv / ".bench-installed"
    if marker.exists() and marker.read_text() == stamp:
        return
    if fresh and venv.exists():
        # A dependency dropped from core's pyproject must leave the measured venv too, or its size lingers.
        shutil.rmtree(venv)
    if not (venv / "bin" / "python").exists():
        subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
    install()
    marker.write_text(stamp)


def ensure_peer_venv() -> Path:
    """``.venv-peer`` with only the peer installed from PyPI (created once, then reused)."""
    print(f"peer: {PEER_REQUIREMENT} in {PEER_VENV.name} (installed once, ~800 MB)", flush=True)
    _ensure_venv(PEER_VENV, PEER_REQUIREMENT, lambda: _pip(PEER_VENV, PEER_REQUIREMENT))
    return PEER_VENV


def _core_fingerprint() -> str:
    digest = hashlib.sha256()
    core = ROOT / "core"
    for path in sorted([core / "pyproject.toml", *(core / "agentlightning").rglob("*")]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(core)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def ensure_core_venv() -> Path:
    """``.venv-core`` with only ``pip install ./core`` (reinstalled when core's files change)."""

    def install() -> None:
        _pip(CORE_VENV, str(ROOT / "core"))  # its dependencies, as a user's install gets them
        _pip(CORE_VENV, "--force-reinstall", "--no-deps", str(ROOT / "core"))  # our current files, same version

    _ensure_venv(CORE_VENV, _core_fingerprint(), install, fresh=True)
    return CORE_VENV


def ensure_empty_venv() -> Path:
    """``.venv-empty``: a fresh venv with nothing installed (pip only), the size baseline."""
    _ensure_venv(EMPTY_VENV, "empty", lambda: None)
    return EMPTY_VENV


# --- footprint ---------------------------------------------------------------------------------------------------
_IMPORTTIME = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \| agentlightning$")


def import_once(venv: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """One fresh process importing the package: (cumulative ``-X importtime`` of ``agentlightning``, process wall)."""
    began = time.perf_counter()
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-X", "importtime", "-c", "import agentlightning"],
        cwd=tempfile.gettempdir(),  # not the repository: its folders must not shadow the installed package
        env={**_clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - began
    for line in done.stderr.splitlines():
        found = _IMPORTTIME.match(line.strip())
        if found:
            return int(found.group(1)) / 1e6, wall
    raise RuntimeError(f"no importtime line for agentlightning from {venv}: {done.stderr[-500:]}")


def _clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}


def importtime_top(venv: Path, count: int = 12) -> str:
    """The modules with the largest cumulative import time under ``import agentlightning`` (a profile of it)."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-X", "importtime", "-c", "import agentlightning"],
        cwd=tempfile.gettempdir(),
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[tuple[int, str]] = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    rows.sort(reverse=True)
    return "\n".join(f"{micros / 1000:8.1f} ms  {name}" for micros, name in rows[:count])


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


def largest_packages(venv: Path, empty: Path, count: int = 12) -> str:
    """The largest top-level entries a venv's site-packages adds to an empty venv's (what its size is made of)."""
    baseline = {path.name for path in _site_packages(empty).iterdir()}
    added = [path for path in _site_packages(venv).iterdir() if path.name not in baseline]
    sizes = sorted(((tree_bytes(p) if p.is_dir() else p.stat().st_size, p.name) for p in added), reverse=True)
    return "\n".join(f"{size / MB:7.1f} MB  {name}" for size, name in sizes[:count])


def footprint(runs: int, comparison: Comparison) -> None:
    """Import time (interleaved runs) and installed size, ours vs the peer."""
    core, peer, empty = ensure_core_venv(), ensure_peer_venv(), ensure_empty_venv()
    print("footprint: import time and installed size", flush=True)
    baseline = tree_bytes(empty)
    ours_mb, theirs_mb = (tree_bytes(core) - baseline) / MB, (tree_bytes(peer) - baseline) / MB
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    for _ in range(runs):
        ours.append(import_once(core))
        theirs.append(import_once(peer))
    ours_import = summarize([cumulative for cumulative, _ in ours])
    comparison.rows += [
        Row(
            "import agentlightning (-X importtime, cumulative)",
            "s",
            ours_import,
            summarize([cumulative for cumulative, _ in theirs]),
            False,
            "< 0.3 s",
            ours_import.median < 0.3,
            3,
        ),
        Row(
            "python -c 'import agentlightning' (process wall)",
            "s",
            summarize([wall for _, wall in ours]),
            summarize([wall for _, wall in theirs]),
            False,
            digits=3,
        ),
        Row(
            "installed size (fresh venv minus empty venv)",
            "MB",
            summarize([ours_mb]),
            summarize([theirs_mb]),
            False,
            "< 40 MB",
            ours_mb < 40,
            1,
        ),
    ]
    comparison.notes.append(
        "Import: measured in each side's fresh single-package venv with the default environment. Without network "
        "the peer's import also retries a download of LiteLLM's model price list for several seconds; its side "
        "workers and server run with LITELLM_LOCAL_MODEL_COST_MAP=True to skip that (start-up only, nothing measured)."
    )
    comparison.profiles["our installed size: largest packages added to an empty venv (MB = 10^6 bytes)"] = (
        largest_packages(core, empty)
    )
    if ours_import.median >= 0.3:
        comparison.profiles["our import: slowest modules (-X importtime, cumulative)"] = importtime_top(core)


# --- store and tracer ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _workers(peer: Path) -> Iterator[tuple[SideWorker, SideWorker]]:
    """Both side workers, started at once (their imports overlap); they are waited for on first use."""
    ours = SideWorker("ours", [str(ROOT / ".venv" / "bin" / "python"), "-m", "bench.peer.ours"], cwd=ROOT)
    try:
        theirs = SideWorker(
            "peer", [str(peer / "bin" / "python"), "-m", "bench.peer.theirs"], cwd=ROOT, env=PEER_QUIET_ENV
        )
        try:
            yield ours, theirs
        finally:
            theirs.close()
    finally:
        ours.close()


@contextlib.contextmanager
def _servers(peer: Path) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """Each side's store server (``agl store``, its own process) on loopback: yields (URL, pid) of ours, theirs."""
    ours_port, theirs_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        ours_cmd = [str(ROOT / ".venv" / "bin" / "agl"), "store", "--path", f"{tmp}/store.db", "--port", str(ours_port)]
        theirs_cmd = [str(peer / "bin" / "agl"), "store", "--host", "127.0.0.1", "--port", str(theirs_port)]
        theirs_cmd += ["--log-level", "WARNING"]  # its INFO default logs every request; spare it that cost
        with (
            server_process(ours_cmd, f"http://127.0.0.1:{ours_port}/health", cwd=ROOT) as ours_pid,
            server_process(
                theirs_cmd,
                f"http://127.0.0.1:{theirs_port}/v1/agl/health",
                cwd=Path(tempfile.gettempdir()),
                env=PEER_QUIET_ENV,
            ) as theirs_pid,
        ):
            yield (f"http://127.0.0.1:{ours_port}", ours_pid), (f"http://127.0.0.1:{theirs_port}", theirs_pid)


Side = tuple[SideWorker, dict[str, object], int | None]  # worker, its parameters, its server's pid (over HTTP)


def _figures(measure: str, reply: dict[str, float], server_cpu_s: float) -> tuple[float, float]:
    """(wall figure, CPU figure) of one reply: rates per second, or microseconds per span for the tracer."""
    units, wall, cpu = reply["units"], reply["wall_s"], reply["cpu_s"] + server_cpu_s
    if measure == "tracer":
        return wall / units * 1e6, cpu / units * 1e6
    return units / wall, units / max(cpu, 1e-9)


def _interleaved(
    sides: Sequence[Side], runs: int, measure: str, label: str, notes: list[str], *, warmup: bool
) -> list[tuple[Summary | None, Summary | None]]:
    """An optional warm-up run per side, then ``runs`` runs alternating which side goes first; (wall, CPU) per side."""
    walls: list[list[float]] = [[] for _ in sides]
    cpus: list[list[float]] = [[] for _ in sides]
    order = list(enumerate(sides))
    first = 0 if warmup else 1
    for index in range(first, runs + 1):
        for position, (side, parameters, server_pid) in order if index % 2 == 0 else order[::-1]:
            server_before = process_cpu_s(server_pid) if server_pid else 0.0
            try:
                reply = side.request(measure, **parameters)
            except RuntimeError as exc:  # reported in the notes; the other figures still run
                notes.append(f"{label}: {exc}")
                continue
            server_cpu = process_cpu_s(server_pid) - server_before if server_pid else 0.0
            if index > 0:
                wall, cpu = _figures(measure, reply, server_cpu)
                walls[position].append(wall)
                cpus[position].append(cpu)
    return [
        (summarize(wall) if wall else None, summarize(cpu) if cpu else None)
        for wall, cpu in zip(walls, cpus, strict=True)
    ]


def _ten_times(ours: Summary | None, theirs: Summary | None) -> bool | None:
    if ours is None or theirs is None:
        return None
    return ours.median >= 10 * theirs.median


def store_and_tracer(sizes: Sizes, comparison: Comparison, peer: Path) -> None:
    """Store ingest, full cycles (in process and HTTP) and tracer overhead, interleaved between the sides."""
    print("store and tracer (interleaved runs)", flush=True)
    with _workers(peer) as (ours, theirs), _servers(peer) as servers:

        def compare(
            label: str,
            unit: str,
            measure: str,
            over_http: bool,
            warmup: bool,
            target: bool = True,
            **parameters: object,
        ) -> None:
            print(f"  {label} ...", flush=True)
            if over_http:
                (ours_url, ours_pid), (theirs_url, theirs_pid) = servers
                sides: list[Side] = [(ours, {**parameters, "url": ours_url}, ours_pid)]
                sides.append((theirs, {**parameters, "url": theirs_url}, theirs_pid))
            else:
                sides = [(ours, parameters, None), (theirs, parameters, None)]
            (mine, mine_cpu), (peer_wall, peer_cpu) = _interleaved(
                sides, sizes.runs, measure, label, comparison.notes, warmup=warmup
            )
            if measure == "tracer":
                met = None if mine is None else mine.median < 50
                row = Row(label, unit, mine, peer_wall, False, "< 50 µs", met, 1, mine_cpu, peer_cpu)
            elif target:
                met = _ten_times(mine, peer_wall)
                row = Row(label, unit, mine, peer_wall, True, ">= 10x peer", met, 0, mine_cpu, peer_cpu)
            else:
                row = Row(label, unit, mine, peer_wall, True, "", None, 0, mine_cpu, peer_cpu)
            comparison.rows.append(row)

        # A warm-up run before the first figure of each kind only (imports, connections, SQLite pages): the
        # suite has to fit in ten minutes on a shared machine.
        compare("store ingest (batches of 100)", "spans/s", "ingest", False, True, spans=sizes.ingest_spans)
        for workers in (1, 16, 64):
            label = _in_process_cycle_label(workers)
            compare(label, "rollouts/s", "cycles", False, workers == 1, cycles=sizes.cycles, workers=workers)
        _cycle_floor(ours, sizes, comparison)
        for workers in (1, 16):
            # For context, not the target: the same cycle with our in-memory store against the peer's (no disk, no
            # durability on either side).
            label = f"{_in_process_cycle_label(workers)}, our in-memory store (no target)"
            parameters = {"cycles": sizes.cycles, "workers": workers, "backend": "memory"}
            compare(label, "rollouts/s", "cycles", False, False, target=False, **parameters)
        for workers in (1, 16, 64):
            cycles = max(sizes.http_cycles, 2 * workers)  # at least two rollouts per worker
            label = f"full cycle, HTTP, {workers} workers"
            compare(label, "rollouts/s", "cycles", True, workers == 1, cycles=cycles, workers=workers)
        label = "tracer overhead per LLM-call span (agent thread, wall)"
        compare(label, "µs", "tracer", False, True, spans=sizes.tracer_spans)

        for row in comparison.rows:
            request = _profile_request(row, sizes) if row.target_met is False else None
            if request is not None:
                try:
                    profile = ours.request("profile", **request)
                except RuntimeError as exc:
                    profile = f"profiling failed: {exc}"
                comparison.profiles[f"ours, {row.label}: cProfile of one run"] = str(profile)


def _in_process_cycle_label(workers: int) -> str:
    """The label of the in-process cycle row at ``workers`` (the floor row looks the peer's figure up by it)."""
    return f"full cycle, in process, {workers} workers"


def _cycle_floor(ours: SideWorker, sizes: Sizes, comparison: Comparison) -> None:
    """The durable floor at 1 worker (bare SQLite appends, no store) against the peer's 1-worker cycle of this run.

    It shows how far any SQLite design that makes each call durable could go: the missed 1-worker target is a
    property of per-call durability on this machine, not of our store's code.
    """
    label = "full cycle floor, 1 worker: three durable SQLite appends, no store logic (no target)"
    print(f"  {label} ...", flush=True)
    [(floor, floor_cpu)] = _interleaved(
        [(ours, {"cycles": sizes.cycles}, None)], sizes.runs, "cycle_floor", label, comparison.notes, warmup=True
    )
    peer = next((row for row in comparison.rows if row.label == _in_process_cycle_label(1)), None)
    theirs, theirs_cpu = (peer.theirs, peer.theirs_cpu) if peer else (None, None)
    comparison.rows.append(Row(label, "rollouts/s", floor, theirs, True, "", None, 0, floor_cpu, theirs_cpu))
    comparison.notes.append(
        "Durable floor: one worker, no asyncio, three BEGIN IMMEDIATE/INSERT/COMMIT appends per cycle to one table "
        "without indexes (WAL, synchronous=NORMAL, as our store), the 10 spans re-addressed and encoded as in the "
        "real cycle; no state is read or checked. Its peer column repeats the peer's 1-worker cycle of this run. "
        "It bounds what any SQLite design that makes each call durable could reach at 1 worker on this machine."
    )


def _profile_request(row: Row, sizes: Sizes) -> dict[str, object] | None:
    if row.label.startswith("store ingest"):
        return {"of": "ingest", "spans": sizes.ingest_spans}
    if row.label.startswith("tracer"):
        return {"of": "tracer", "spans": sizes.tracer_spans}
    found = re.match(r"full cycle, (in process|HTTP), (\d+) workers", row.label)
    if found and found.group(1) == "in process":
        return {"of": "cycles", "cycles": sizes.cycles, "workers": int(found.group(2))}
    return None  # over HTTP most of the time is spent in the server process, which cProfile here cannot see


# --- the table -----------------------------------------------------------------------------------------------------
def run_comparison(sizes: Sizes) -> Comparison:
    """Every compared figure, with notes and profiles of missed targets."""
    comparison = Comparison()
    peer = ensure_peer_venv()
    footprint(sizes.import_runs, comparison)
    store_and_tracer(sizes, comparison, peer)
    return comparison


def _cell(summary: Summary | None, digits: int) -> str:
    return summary.format(digits) if summary else "failed"


def _times(ratio: float | None) -> str:
    return f"{ratio:,.2f}x" if ratio is not None else "—"


def markdown_table(rows: Sequence[Row]) -> str:
    """The comparison as a Markdown table: medians (min–max), ratios (>1x = ours better), targets."""
    lines = [
        "| figure | unit | ours | peer (agentlightning 0.3.0) | ours vs peer | per CPU: ours | per CPU: peer "
        "| per CPU: ours vs peer | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cpu = (
            [_cell(row.ours_cpu, row.digits), _cell(row.theirs_cpu, row.digits), _times(row.cpu_ratio)]
            if row.ours_cpu or row.theirs_cpu
            else ["", "", ""]
        )
        met = {True: "yes", False: "**NO**", None: ""}[row.target_met]
        cells = [row.label, row.unit, _cell(row.ours, row.digits), _cell(row.theirs, row.digits), _times(row.ratio)]
        lines.append("| " + " | ".join([*cells, *cpu, row.target, met]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparison alone and print its table."""
    parser = argparse.ArgumentParser(description="Ours vs Microsoft agentlightning 0.3.0, side by side.")
    parser.add_argument("--quick", action="store_true", help="fewer runs and less work per run (a smoke check)")
    args = parser.parse_args(argv)
    comparison = run_comparison(QUICK if args.quick else Sizes())
    print(markdown_table(comparison.rows))
    for note in comparison.notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
