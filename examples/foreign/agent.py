"""A support-ticket router traced the way many teams already trace: OpenInference and the stock OTLP exporter.

It knows nothing of Agent Lightning. It reads a customer's ticket and answers with the team that should take it,
with one chat completion of an OpenAI-compatible model. Tracing is OpenInference's OpenAI instrumentor with the
OpenTelemetry SDK and its OTLP/HTTP span exporter, configured only by the standard environment variables, as a
deployed agent would be:

* ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: the model's endpoint (read by the ``openai`` client);
* ``ROUTER_MODEL``, ``ROUTER_TEMPERATURE``, ``ROUTER_MAX_TOKENS``: the model name and sampling (this agent's own);
* ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: where spans go (any OTLP/HTTP collector: Phoenix, Langfuse, or an
  Agent Lightning store at ``<store url>/v1/traces``);
* ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``: attributes and headers every exported span
  carries (read by the SDK).

Run it once from a shell: ``python -m examples.foreign.agent "I was charged twice for my order"``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from typing import Any

TEAMS = ("billing", "shipping", "returns", "account")
SYSTEM_PROMPT = "Route the customer ticket to one team: billing, shipping, returns or account. Reply with the team."


def route(client: Any, ticket: str, *, model: str, temperature: float = 0.0, max_tokens: int = 8) -> str:
    """The team the model picks for ``ticket`` (its reply, stripped and lower-cased)."""
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ticket}],
        temperature=temperature,
        max_tokens=max_tokens,
    )
    return (reply.choices[0].message.content or "").strip().lower()


@functools.cache
def _client(base_url: str | None, api_key: str | None) -> Any:
    """One OpenAI client per endpoint for the life of the process (building one loads the CA bundle: ~60 ms)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def traced_run(ticket: str, environ: Mapping[str, str] | None = None) -> str:
    """One run of the agent as its program makes it: tracing set up from the environment, the ticket routed, every
    span exported before returning. ``environ`` is added to ``os.environ`` first (a launcher's variables)."""
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    os.environ.update(environ or {})
    provider = TracerProvider()  # its Resource reads OTEL_RESOURCE_ATTRIBUTES
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))  # endpoint and headers from OTEL_* too
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        return route(
            _client(os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY")),
            ticket,
            model=os.environ.get("ROUTER_MODEL", "gpt-4o-mini"),
            temperature=float(os.environ.get("ROUTER_TEMPERATURE", "0")),
            max_tokens=int(os.environ.get("ROUTER_MAX_TOKENS", "8")),
        )
    finally:
        instrumentor.uninstrument()  # a launcher reusing this process instruments afresh for the next run
        provider.shutdown()  # flushes: the run's spans are at the collector when it returns


if __name__ == "__main__":
    print(traced_run(" ".join(sys.argv[1:]) or "My package never arrived."))
