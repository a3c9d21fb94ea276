"""Bad input and failing upstreams: clear errors for the agent, the span of every call that reached the upstream."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from agentlightning import semconv as sc
from agentlightning.proxy import ProxyServer
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.testing import FakeError, FakeOpenAI, FakeReply
from agentlightning.types import Span
from tests.core.proxy.conftest import ProxyRig

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_unknown_rollout_or_attempt_is_404_with_a_message(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    unknown_rollout = httpx.post(f"{rig.proxy.url_for('ro-nope', attempt_id)}/chat/completions", json=BODY)
    assert unknown_rollout.status_code == 404
    assert "rollout ro-nope is not in the store" in unknown_rollout.json()["error"]["message"]
    unknown_attempt = httpx.post(f"{rig.proxy.url_for(rollout_id, 'at-nope')}/responses", json=BODY)
    assert unknown_attempt.status_code == 404
    assert f"has no attempt at-nope; its attempts are ['{attempt_id}']" in unknown_attempt.json()["error"]["message"]
    client = rig.client(rig.proxy.url_for("ro-nope", "at-x"), max_retries=0)
    with pytest.raises(openai.NotFoundError, match="not in the store"):
        client.chat.completions.create(**BODY)
    half = httpx.post(f"{rig.proxy.base_url}/chat/completions", json=BODY, headers={sc.HEADER_ROLLOUT_ID: rollout_id})
    assert half.status_code == 400 and sc.HEADER_ATTEMPT_ID in half.json()["error"]["message"]
    assert rig.fake.requests == []


def test_body_not_json_is_400(rig: ProxyRig) -> None:
    rollout_id, attempt_id = rig.new_attempt()
    for url in (rig.proxy.base_url, rig.proxy.url_for(rollout_id, attempt_id)):
        reply = httpx.post(
            f"{url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert reply.status_code == 400 and "not JSON" in reply.json()["error"]["message"]
        listed = httpx.post(f"{url}/responses", json=[1, 2])
        assert listed.status_code == 400 and "JSON object" in listed.json()["error"]["message"]
    assert rig.fake.requests == [] and rig.spans(rollout_id) == []


def test_upstream_down_is_502_and_recorded(make_rig: Callable[..., ProxyRig]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    rig = make_rig(FakeOpenAI(), upstream_url=dead)
    rollout_id, attempt_id = rig.new_attempt()
    reply = httpx.post(f"{rig.proxy.url_for(rollout_id, attempt_id)}/chat/completions", json=BODY)
    assert reply.status_code == 502
    assert "could not reach the upstream" in reply.json()["error"]["message"]
    assert httpx.get(f"{rig.proxy.base_url}/models").status_code == 502
    [span] = rig.spans(rollout_id)
    assert span.status.code == "ERROR" and "could not reach" in (span.status.message or "")
    assert span.attributes[sc.ERROR_TYPE] == "ConnectError"


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_pass_through_and_are_recorded(fake: FakeOpenAI, rig: ProxyRig, stream: bool) -> None:
    fake.reply = lambda r: FakeError(503, "model overloaded") if "fail" in r.last_user_text else FakeReply("ok")
    rollout_id, attempt_id = rig.new_attempt()
    body = {"model": "m", "messages": [{"role": "user", "content": "fail now"}], "stream": stream}
    direct = httpx.post(f"{rig.upstream_url}/chat/completions", json=body)
    got = httpx.post(f"{rig.proxy.url_for(rollout_id, attempt_id)}/chat/completions", json=body)
    assert (got.status_code, got.content) == (503, direct.content)
    client = rig.client(rig.proxy.url_for(rollout_id, attempt_id), max_retries=0)
    with pytest.raises(openai.InternalServerError, match="model overloaded"):
        client.responses.create(model="m", input="fail please", stream=stream)
    spans = rig.spans(rollout_id)
    assert len(spans) == 2
    for span in spans:
        assert span.status.code == "ERROR" and span.status.message == "model overloaded"
        assert span.attributes[sc.ERROR_TYPE] == "503"
        assert span.attributes[sc.POLICY_VERSION] == 1


def test_upstream_without_token_ids_is_asked_once_then_never(make_rig: Callable[..., ProxyRig]) -> None:
    rig = make_rig(FakeOpenAI(supports_token_ids=False))
    rollout_id, attempt_id = rig.new_attempt()
    client = rig.client(rig.proxy.url_for(rollout_id, attempt_id))
    for _ in range(2):
        assert client.chat.completions.create(**BODY).choices[0].message.content == "echo: hi"
    spans = rig.spans(rollout_id)
    assert ["return_token_ids" in body for body in rig.fake.requests] == [True, False, False]
    assert all(span.status.code == "OK" and sc.RESPONSE_TOKEN_IDS not in span.attributes for span in spans)
    assert all(len(span.attributes[sc.RESPONSE_LOGPROBS]) == len("echo: hi") for span in spans)  # type: ignore[arg-type]


def test_client_disconnect_mid_stream_still_records_the_span(make_rig: Callable[..., ProxyRig]) -> None:
    rig = make_rig(FakeOpenAI(reply="a long answer that streams slowly", chunk_delay_s=0.05))
    rollout_id, attempt_id = rig.new_attempt()
    url = f"{rig.proxy.url_for(rollout_id, attempt_id)}/chat/completions"
    with httpx.stream("POST", url, json={**BODY, "stream": True}) as reply:
        first = next(reply.iter_bytes())
    assert first.startswith(b"data: ")
    deadline = time.monotonic() + 5
    while not (spans := rig.spans(rollout_id)) and time.monotonic() < deadline:
        time.sleep(0.02)
    [span] = spans
    assert span.status.code == "ERROR" and "disconnected" in (span.status.message or "")
    assert span.attributes[sc.PROMPT_TOKEN_IDS]  # what arrived before the cut is kept


def test_serve_proxy_needs_exactly_one_store() -> None:
    from agentlightning.proxy import serve_proxy

    with pytest.raises(ValueError, match="exactly one store"):
        serve_proxy(upstream="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="must start with http"):
        serve_proxy(upstream="127.0.0.1:1", store=InMemoryLightningStore())


class _FlakyStore(InMemoryLightningStore):
    """The real in-memory store, except that the first writes fail as a store server that is down would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store is restarting")
        return await super().add_spans(spans)


def test_spans_survive_a_store_that_fails_for_a_while(fake: FakeOpenAI) -> None:
    store = _FlakyStore(failures=2)
    with fake.serve() as upstream, ProxyServer(store, upstream.base_url) as proxy:
        rig = ProxyRig(store, fake, upstream, proxy, ExitStack())
        rollout_id, attempt_id = rig.new_attempt()
        client = rig.client(proxy.url_for(rollout_id, attempt_id))
        for _ in range(3):
            client.chat.completions.create(**BODY)
        spans = rig.spans(rollout_id)
        rig.stack.close()
    assert store.failures == 0 and len(spans) == 3


def test_upstream_breaking_mid_stream_is_recorded(make_rig: Callable[..., ProxyRig]) -> None:
    chunk = b'data: {"id":"c1","model":"m","prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"content":"hi"},"token_ids":[7]}]}\n\n'  # noqa: E501

    class Cut(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while self.rfile.readline() not in (b"\r\n", b""):
                pass  # the body is never read: the answer starts, then the connection dies
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"ff\r\npartial")  # a chunk that never completes
            self.wfile.flush()

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Cut) as upstream:
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        rig = make_rig(FakeOpenAI(), upstream_url=f"http://127.0.0.1:{upstream.server_address[1]}/v1")
        rollout_id, attempt_id = rig.new_attempt()
        url = f"{rig.proxy.url_for(rollout_id, attempt_id)}/chat/completions"
        with pytest.raises(httpx.HTTPError), httpx.stream("POST", url, json={**BODY, "stream": True}) as reply:
            for _ in reply.iter_bytes():
                pass
        [span] = rig.spans(rollout_id)
        upstream.shutdown()
    assert span.status.code == "ERROR" and "stream broke" in (span.status.message or "")
    assert span.attributes[sc.PROMPT_TOKEN_IDS] == [1, 2] and span.attributes[sc.RESPONSE_TOKEN_IDS] == [7]
