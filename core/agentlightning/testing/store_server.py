"""A store server in a child process that can be killed with SIGKILL and started again in place (fault drills).

Used by the scale tests and ``bench/soak.py``; Linux (``/proc`` for memory figures).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentlightning.testing.postgres import free_port

__all__ = ["StoreServerProcess", "rss_bytes"]


class StoreServerProcess:
    """``serve_store`` in a child process on a fixed loopback port, so it can be killed and restarted in place."""

    def __init__(self, backend: str, *, path: str | None = None, dsn: str | None = None) -> None:
        self.backend, self.path, self.dsn = backend, path, dsn
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> StoreServerProcess:
        """Start the server and wait until ``/health`` answers."""
        code = (
            "from agentlightning.server import serve_store; "
            f"serve_store(backend={self.backend!r}, path={self.path!r}, dsn={self.dsn!r}, port={self.port})"
        )
        self.process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                self.stop()
                raise RuntimeError(f"store server ({self.backend}) did not start on {self.url}: {err[-3000:]}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.process is not None, "server not started"
        return self.process.pid

    def kill9(self) -> None:
        """SIGKILL the server: no shutdown code runs."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        assert self.process.returncode == -signal.SIGKILL
        self._close_pipes()

    def stop(self) -> None:
        """SIGTERM the server (it drains and closes its store) and reap it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_pipes()
        self.process = None

    def _close_pipes(self) -> None:
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
