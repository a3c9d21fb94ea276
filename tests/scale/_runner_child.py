"""A runner process for the scale tests: ``python _runner_child.py URL AGENT WORKER_ID WORKERS [MAX_ROLLOUTS]``.

Runs :class:`Runner` against the store server at URL until SIGTERM (or MAX_ROLLOUTS claimed), then prints its
stats as one JSON line. Prints ``ready`` once the runner started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.scale.agents

from agentlightning.agent import load_agent
from agentlightning.client import LightningStoreClient
from agentlightning.runner import Runner


async def main(url: str, agent: str, worker_id: str, workers: int, max_rollouts: int | None) -> None:
    # Many retries: the scale tests restart the store server under running runners.
    client = LightningStoreClient(url, max_retries=12, max_backoff_s=1.0, long_poll_s=1.0)
    runner = Runner(load_agent(agent), client, n_workers=workers, worker_id=worker_id, heartbeat_interval_s=0.3)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, runner.stop)
    print("ready", flush=True)
    try:
        stats = await runner.run(max_rollouts=max_rollouts)
    finally:
        # A SIGTERM that arrives after the run ended (the test stops a runner that already reached MAX_ROLLOUTS)
        # asks for nothing more; left to the default action it would kill the process before it prints its stats.
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        await client.close()
    print(json.dumps(dataclasses.asdict(stats)), flush=True)


if __name__ == "__main__":
    limit = int(sys.argv[5]) if len(sys.argv) > 5 else None
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), limit))
