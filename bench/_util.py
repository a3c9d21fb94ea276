"""Shared helpers of the benchmark suite: summaries, the side-worker protocol, the machine, loopback servers.

Standard library only: ``bench/peer/theirs.py`` runs in the peer's virtual environment (Microsoft agentlightning
0.3.0), where our package is not installed, and imports this module too.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# What one LLM call records, with the same content on both sides: GenAI attributes, chat messages as JSON strings
# and 32 prompt / 8 response token ids (~700 bytes as JSON, as bench/store.py's spans).
LLM_SPAN_NAME = "chat gpt-4o-mini"
LLM_SPAN_ATTRIBUTES: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "gpt-4o-mini",
    "gen_ai.usage.input_tokens": 120,
    "gen_ai.usage.output_tokens": 40,
    "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "What is 2+2?"}]}]',
    "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}]',
    "agentlightning.prompt_token_ids": list(range(32)),
    "agentlightning.response_token_ids": list(range(8)),
}
SPANS_PER_CYCLE = 10
INGEST_BATCH = 100

# Lines a side worker writes for the orchestrator start with this marker; anything else on its stdout (a library's
# log line or banner) is ignored.
REPLY_MARKER = "@@bench "


@dataclass(frozen=True)
class Summary:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    runs: int

    def format(self, digits: int = 0) -> str:
        """``median (min–max)`` with thousands separators."""
        return f"{self.median:,.{digits}f} ({self.low:,.{digits}f}–{self.high:,.{digits}f})"


def summarize(values: Sequence[float]) -> Summary:
    """Median, min and max of ``values`` (at least one)."""
    if not values:
        raise ValueError("summarize needs at least one value")
    return Summary(statistics.median(values), min(values), max(values), len(values))


def repeat(runs: int, once: Callable[[], float], *, warmup: int = 1) -> Summary:
    """Run ``once`` ``warmup`` times unmeasured, then ``runs`` times, and summarize its results."""
    for _ in range(warmup):
        once()
    return summarize([once() for _ in range(runs)])


class Stopwatch:
    """Wall and process CPU time (all threads) of one measured section; ``result`` is a side worker's reply."""

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self.wall_s: float | None = None

    def stop_wall(self) -> None:
        """End the wall-clock part here (CPU keeps counting until ``result``, e.g. through a flush)."""
        self.wall_s = time.perf_counter() - self._wall

    def result(self, units: int) -> dict[str, float]:
        """``{"units", "wall_s", "cpu_s"}`` of the section, for ``units`` spans or rollouts."""
        wall = self.wall_s if self.wall_s is not None else time.perf_counter() - self._wall
        return {"units": units, "wall_s": wall, "cpu_s": time.process_time() - self._cpu}


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- side workers ------------------------------------------------------------------------------------------------
Handler = Callable[[Mapping[str, Any]], Any]  # returns a JSON-serialisable value (a figure, or a profile's text)


def serve_measurements(handlers: Mapping[str, Handler]) -> None:
    """Answer measurement requests, one JSON object a line on stdin, until stdin closes (the side-worker loop).

    A request is ``{"measure": name, ...parameters}``; the reply is ``{"value": ...}`` or ``{"error": text}``.
    """
    print(REPLY_MARKER + json.dumps({"ready": sorted(handlers)}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply: dict[str, Any] = {"value": handlers[request["measure"]](request)}
        except Exception as exc:  # the orchestrator reports it and carries on with the other figures
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(REPLY_MARKER + json.dumps(reply), flush=True)


class SideWorker:
    """A long-lived worker process of one side; runs measurements on request so both sides can be interleaved."""

    def __init__(self, name: str, command: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self._process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._ready = False

    def wait_ready(self) -> None:
        """Block until the worker has imported its package and answers (start several, then wait for all)."""
        if not self._ready:
            self._read_reply()
            self._ready = True

    def _read_reply(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(REPLY_MARKER):
                return json.loads(line[len(REPLY_MARKER) :])
        raise RuntimeError(f"{self.name} worker exited with code {self._process.wait()} before answering")

    def request(self, measure: str, **parameters: Any) -> Any:
        """Run one request in the worker and return its value (raises RuntimeError with the worker's error)."""
        self.wait_ready()
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"measure": measure, **parameters}) + "\n")
        self._process.stdin.flush()
        reply = self._read_reply()
        if "error" in reply:
            raise RuntimeError(f"{self.name} {measure}: {reply['error']}")
        return reply["value"]

    def close(self) -> None:
        """End the worker (closing its stdin ends its loop)."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


# --- loopback servers --------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def server_process(
    command: Sequence[str], health_url: str, *, cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> Iterator[int]:
    """Run a server command until the block ends; yields its pid once ``health_url`` answers 200."""
    child = subprocess.Popen(
        list(command),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(health_url, timeout=1) as response:
                if response.status == 200:
                    break
            if child.poll() is not None or time.monotonic() > deadline:
                child.kill()
                error = child.stderr.read().decode(errors="replace")[-2000:] if child.stderr else ""
                raise RuntimeError(f"server {' '.join(command)} did not start: {error}")
            time.sleep(0.1)
        yield child.pid
    finally:
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# --- the machine -------------------------------------------------------------------------------------------------
def machine_description() -> dict[str, str]:
    """CPU model, cores, RAM, OS, Python and the date (UTC), for the results file."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
                break
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "RAM": ram,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


class LoadSampler:
    """Samples the 1-minute load average in the background while the suite runs (the machine is shared)."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> Summary:
        """Stop sampling; the summary of the samples taken."""
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return summarize(self.samples)


def tree_bytes(root: Path) -> int:
    """Apparent size of every file under ``root`` (links not followed), in bytes."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total
