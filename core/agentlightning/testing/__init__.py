"""Test tooling for Agent Lightning and its users: a deterministic fake OpenAI-compatible upstream."""

from agentlightning.testing.fake_openai import (
    FakeError,
    FakeOpenAI,
    FakeOpenAIServer,
    FakeReply,
    FakeRequest,
    FakeToolCall,
    ReplyRule,
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
    "logprob_of",
    "tokenize",
]
