"""Processes and faults for the scale tests: runner processes, and a TCP proxy that stalls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUNNER_CHILD = str(Path(__file__).with_name("_runner_child.py"))


class RunnerProcess:
    """A runner process (``_runner_child.py``) against a store URL; ``finish()`` stops it and returns its stats."""

    def __init__(self, url: str, agent: str, worker_id: str, workers: int, max_rollouts: int | None = None) -> None:
        command = [sys.executable, RUNNER_CHILD, url, f"tests.scale.agents:{agent}", worker_id, str(workers)]
        if max_rollouts is not None:
            command.append(str(max_rollouts))
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def kill9(self) -> None:
        """SIGKILL the runner mid-work."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.communicate(timeout=30)

    def finish(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """SIGTERM (stop after current attempts), wait, and return the stats it printed."""
        if self.process.poll() is None:
            self.process.terminate()
        out, err = self.process.communicate(timeout=timeout_s)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if self.process.returncode != 0 or not lines:
            raise AssertionError(f"runner exited {self.process.returncode}: {out[-2000:]}\n{err[-4000:]}")
        return dict(json.loads(lines[-1]))

    def kill_quietly(self) -> None:
        """Cleanup: kill if still running."""
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            self.process.communicate(timeout=10)


class StallProxy:
    """A TCP proxy on loopback whose forwarding can be paused, as a network stall would (connections stay open)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._running = asyncio.Event()
        self._running.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """URL of the proxy's listening side."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> StallProxy:
        """Listen on an ephemeral loopback port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def pause(self) -> None:
        """Stop forwarding bytes in both directions (data waits in the socket buffers)."""
        self._running.clear()

    def resume(self) -> None:
        """Forward again."""
        self._running.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._running.wait()
                sink.write(data)
                await sink.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            sink.close()

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
