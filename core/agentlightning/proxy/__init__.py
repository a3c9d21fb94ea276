"""OpenAI-compatible LLM proxy: point an unmodified agent's base URL at it and every call becomes an LLM span.

Spans carry the engine's token ids and logprobs (no retokenisation drift) and the upstream's policy version.
See :func:`create_proxy_app` for the routes and what the proxy adds to upstream requests.
"""

from agentlightning.extras import require_server_extra

require_server_extra("the LLM proxy (agentlightning.proxy)")

from agentlightning.proxy.app import LLMProxy, create_proxy_app, flush_proxy_spans, proxy_of
from agentlightning.proxy.server import ProxyServer, ServedApp, ServedProxy, serve_app, serve_proxy, start_proxy

__all__ = [
    "LLMProxy",
    "ProxyServer",
    "ServedApp",
    "ServedProxy",
    "create_proxy_app",
    "flush_proxy_spans",
    "proxy_of",
    "serve_app",
    "serve_proxy",
    "start_proxy",
]
