"""The agents ``bench.learning --async`` runs in its ``agl runner`` processes: the quickstart agent with a slow tool,
and the same chat call over plain HTTP (``--agent http``).

In a module of their own so that a runner process loads only the agent (the OpenAI SDK and Agent Lightning's core),
as a user's runner does: importing ``bench.learning`` pulls in torch and the trainer, which cost each runner process
~0.9 s to start and ~0.5 s to exit, time both modes' wall clocks counted.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from agentlightning.agent import rollout
from agentlightning.types import LLM
from agentlightning_trainer import tool_choice
from agentlightning_trainer.quickstart.agent import tool_choice_agent

SLOW_TOOL_S = 0.5


@rollout
def slow_tool_agent(task: dict[str, Any], llm: LLM) -> float:
    """The quickstart agent, whose chosen tool then takes SLOW_TOOL_S to answer before the reward is known."""
    reward = float(tool_choice_agent(task, llm))  # a @rollout function called directly is the plain function
    time.sleep(SLOW_TOOL_S)  # the tool call: the runner waits, the CPU does not
    return reward


_THREAD = threading.local()


def _chat_over_http(task: dict[str, Any], llm: LLM) -> str:
    """The quickstart agent's chat call over one keep-alive ``http.client`` connection per runner thread."""
    url = urlsplit(llm.base_url)
    body = {
        "model": llm.model,
        "messages": tool_choice.messages(task),
        "temperature": llm.sampling.get("temperature", 1.0),
        "max_tokens": llm.sampling.get("max_tokens", 8),
    }
    headers = {"content-type": "application/json"}
    conn: http.client.HTTPConnection | None = getattr(_THREAD, "conn", None)
    fresh = conn is None or (conn.host, conn.port) != (url.hostname, url.port)
    while True:
        if fresh or conn is None:
            if conn is not None:
                conn.close()
            conn = _THREAD.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)
        try:
            conn.request("POST", f"{url.path.rstrip('/')}/chat/completions", json.dumps(body), headers)
            response = conn.getresponse()
            break
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if fresh:
                raise
            # The server closed the idle keep-alive connection before it read the request: send it on a new one.
            fresh = True
    answer = json.loads(response.read())
    if response.status != 200:
        raise RuntimeError(f"chat call failed with {response.status}: {answer}")
    return answer["choices"][0]["message"]["content"] or ""


@rollout
def http_agent(task: dict[str, Any], llm: LLM) -> float:
    """The quickstart agent with its chat call made over plain HTTP instead of the OpenAI SDK (``--agent http``)."""
    return tool_choice.score(task, _chat_over_http(task, llm))


@rollout
def http_slow_tool_agent(task: dict[str, Any], llm: LLM) -> float:
    """``http_agent``, whose chosen tool then takes SLOW_TOOL_S to answer before the reward is known."""
    reward = float(http_agent(task, llm))
    time.sleep(SLOW_TOOL_S)
    return reward
