"""Re-tokenisation: token ids for calls recorded without them, rendered exactly as the policy server renders them.

A call from foreign traces (OpenInference, OpenLLMetry, GenAI semconv) or from a model not behind the LLM proxy
carries messages, tools and usage counts but no token ids. :class:`ChatRetokenizer` gives it ids with the policy's
own tokenizer:

* prompt: the recorded messages (system instructions first) and tools through ``tokenizer.encode_chat(messages,
  validate_tools(tools))``, the very call the policy server makes for a request (so training sees what serving
  saw: the tiny GPT's template, or an HF model's chat template with tools rendered as vLLM renders them);
* reply: the assistant message's text, its tool calls written back in the form the model writes them (the tiny
  GPT's compact ``<tool_call>{...}</tool_call>``, the Hermes block elsewhere), encoded, plus the end token when the
  model stopped by itself (finish reason ``stop`` or ``tool_calls``, or none recorded) — the policy server and vLLM
  count that token in ``usage.completion_tokens``.

The recorded usage (``gen_ai.usage.input_tokens`` / ``output_tokens``) is the check: different lengths mean the
ids differ from what the model saw (drift); see :mod:`agentlightning.adapter.retokenize` for what is trained.
What cannot be recovered from a trace: a ``tool_choice`` of ``"none"`` (the server then renders no tools) and a
forced call's prefilled opening (``tool_choice`` ``"required"``); such calls show as drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentlightning.adapter import LLMCall, Retokenized, call_messages
from agentlightning_trainer.config import PolicySpec
from agentlightning_trainer.tool_calls import assistant_calls, content_text, format_tool_call, validate_tools
from agentlightning_trainer.torch_backend.policy import ChatTokenizer, Policy
from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer

__all__ = ["ChatRetokenizer", "retokenizer_for_spec"]

# Finish reasons of a reply that ended on the model's own end token (vLLM and the policy server: "stop";
# a reply parsed into calls reports "tool_calls" although it, too, ended on the end token).
_STOPPED = frozenset({"stop", "tool_calls", "tool_call", "end_turn", "eos"})


class ChatRetokenizer:
    """A :class:`~agentlightning.adapter.Retokenizer` over a policy's tokenizer (call it with an ``LLMCall``)."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        """Render with ``tokenizer`` (a policy's: ``Policy.tokenizer``, or :func:`retokenizer_for_spec`'s)."""
        self.tokenizer = tokenizer
        # The tiny GPT's template and parser use the compact call (no newlines); HF models write the Hermes block.
        self.compact_calls = isinstance(tokenizer, WordCharTokenizer)

    @classmethod
    def for_policy(cls, policy: Policy) -> ChatRetokenizer:
        """The retokenizer of the policy a trainer serves."""
        return cls(policy.tokenizer)

    def __call__(self, call: LLMCall) -> Retokenized:
        """The call's prompt and reply ids, with its recorded usage to check them against."""
        messages, tools, reply = call_messages(call)
        used, wrote = call.input_tokens, call.output_tokens
        if not messages:
            return Retokenized([], [], used, wrote, error="no input messages recorded (gen_ai.input.messages)")
        if reply is None:
            return Retokenized([], [], used, wrote, error="no reply recorded (gen_ai.output.messages)")
        try:
            offered = validate_tools(tools) or None if tools else None
            prompt = self.tokenizer.encode_chat(messages, offered)
        except ValueError as exc:  # a role or tool list the policy server would answer with a 400
            return Retokenized([], [], used, wrote, error=str(exc))
        return Retokenized(prompt, self.encode_reply(reply), used, wrote)

    def encode_reply(self, reply: Mapping[str, Any]) -> list[int]:
        """Token ids of an assistant message as the model wrote it, with the end token when it stopped by itself."""
        text = content_text(reply.get("content"))
        calls = [format_tool_call(name, args, compact=self.compact_calls) for name, args in assistant_calls(reply)]
        if calls:
            separator = "" if self.compact_calls else "\n"
            text = separator.join([text, *calls] if text else calls)
        ids = self.tokenizer.encode(text)
        finish = reply.get("finish_reason")
        if finish is None or str(finish) in _STOPPED:
            ids.append(self.tokenizer.eos_id)
        return ids


def retokenizer_for_spec(spec: PolicySpec) -> ChatRetokenizer:
    """The retokenizer of ``spec``'s model, loading its tokenizer only (``agl check --policy SPEC``)."""
    if spec.kind == "tiny_gpt":
        return ChatRetokenizer(WordCharTokenizer(spec.words))
    from agentlightning_trainer.torch_backend.hf import _transformers  # pyright: ignore[reportPrivateUsage]
    from agentlightning_trainer.torch_backend.hf_tokenizer import HFChatTokenizer
    from agentlightning_trainer.torch_backend.pretrained import resolve_model_path

    assert spec.hf_model is not None  # PolicySpec requires it for kind 'hf'
    source = resolve_model_path(spec.hf_model, spec.cache_dir)
    return ChatRetokenizer(HFChatTokenizer(_transformers().AutoTokenizer.from_pretrained(source)))
