"""The trainer's handle on the policy server: starts ``python -m agentlightning_trainer.policy_server`` in a child
process, waits until it answers, publishes weights to it and stops it (the server itself is policy_server.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from agentlightning_trainer.config import PolicySpec

__all__ = ["PolicyServerProcess", "free_port"]


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PolicyServerProcess:
    """Runs the policy server in a child process and publishes weights to it."""

    def __init__(
        self,
        spec: PolicySpec,
        weights: Path | None,
        *,
        spec_file: Path | None = None,
        version: int = 0,
        port: int | None = None,
        seed: int = 0,
        threads: int = 1,
        startup_timeout_s: float = 120.0,
        log_file: Path | None = None,
        proxy_store: Path | None = None,
        proxy_in_process: bool = True,
    ) -> None:
        """Remember how to start the server; :meth:`start` (or ``with``) launches it.

        ``weights``: a state-dict file to serve, or None for the spec's own weights (a HF model as it is).
        ``spec_file``: where the spec is written for the child (default: next to ``weights``).
        ``proxy_store``: a SQLite store file; the process then also serves the LLM proxy in front of the policy
        (see :attr:`proxy_url`), recording into that store; it calls the policy in process (policy_transport.py), or
        over loopback HTTP with ``proxy_in_process=False``.
        """
        self.spec = spec
        self.weights = weights
        if spec_file is None:
            if weights is None:
                raise ValueError("PolicyServerProcess needs spec_file when it serves no weights file")
            spec_file = weights.with_name("policy_spec.json")
        self.spec_file = spec_file
        self.version = version
        self.port = port or free_port()
        self.seed = seed
        self.threads = threads
        self.startup_timeout_s = startup_timeout_s
        self.log_file = log_file
        self.proxy_store = proxy_store
        self.proxy_port = free_port() if proxy_store is not None else None
        self.proxy_in_process = proxy_in_process
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return self.root_url + "/v1"

    @property
    def proxy_url(self) -> str | None:
        """``http://127.0.0.1:<proxy port>``, the LLM proxy this process serves; None without ``proxy_store``."""
        return None if self.proxy_port is None else f"http://127.0.0.1:{self.proxy_port}"

    def start(self) -> PolicyServerProcess:
        """Launch the child process and wait until ``/health`` answers."""
        self.spec_file.write_text(self.spec.model_dump_json())
        cmd = [
            sys.executable, "-m", "agentlightning_trainer.policy_server",
            "--spec", str(self.spec_file), "--version", str(self.version),
            "--port", str(self.port), "--seed", str(self.seed), "--threads", str(self.threads),
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        if self.weights is not None:
            cmd += ["--weights", str(self.weights)]
        if self.proxy_store is not None:
            cmd += ["--proxy-store", str(self.proxy_store), "--proxy-port", str(self.proxy_port)]
            if not self.proxy_in_process:
                cmd.append("--proxy-over-http")
        if self.log_file is not None:
            with open(self.log_file, "ab") as out:  # the child keeps its own copy of the descriptor
                self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        else:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                where = f"; see {self.log_file}" if self.log_file else ""
                raise RuntimeError(f"the policy server exited with code {self._proc.returncode} at startup{where}")
            with contextlib.suppress(httpx.HTTPError):
                health = httpx.get(self.root_url + "/health", timeout=2.0)
                if health.status_code == 200 and health.json().get("proxy_ready", True):
                    # One keep-alive connection for every publish: a new client per call costs an SSL context.
                    self._client = httpx.Client(timeout=120.0)
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the policy server did not answer on {self.root_url} within {self.startup_timeout_s} s")

    async def publish(self, weights: Path, version: int) -> int:
        """Tell the server to load ``weights`` as ``version``; returns the version it now serves."""
        response = await asyncio.to_thread(
            self._http().post, self.root_url + "/admin/weights", json={"path": str(weights), "version": version}
        )
        if response.status_code != 200:
            raise RuntimeError(f"the policy server refused weights {weights}: {response.text}")
        self.version = int(response.json()["policy_version"])
        return self.version

    async def flush_proxy(self) -> None:
        """Wait until every call the co-hosted LLM proxy has answered so far is in the store."""
        if self.proxy_store is None:
            return
        response = await asyncio.to_thread(self._http().post, self.root_url + "/admin/proxy/flush")
        if response.status_code != 200:
            raise RuntimeError(f"the policy server could not flush its LLM proxy: {response.text}")

    def _http(self) -> httpx.Client:
        if self._client is None:
            raise RuntimeError("the policy server is not running: call start() first")
        return self._client

    def stop(self) -> None:
        """Terminate the child process (idempotent); the co-hosted proxy writes its pending spans first."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> PolicyServerProcess:
        """Start the server."""
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the server."""
        self.stop()
