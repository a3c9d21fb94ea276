"""Test tooling for Agent Lightning and its users: a deterministic fake OpenAI-compatible upstream."""

from agentlightning.extras import require_server_extra

require_server_extra("the fake OpenAI upstream (agentlightning.testing)")

from agentlightning.testing.fake_openai import (
    FakeError,
    FakeOpenAI,
    FakeOpenAIServer,
    FakeReply,
    FakeRequest,
    FakeToolCall,
    ReplyRule,
    call_offered_tools,
    logprob_of,
    tokenize,
)

__all__ = [
    "FakeError",
    "FakeOpenAI",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeRequest",
    "FakeToolCall",
    "ReplyRule",
    "call_offered_tools",
    "logprob_of",
    "tokenize",
]
