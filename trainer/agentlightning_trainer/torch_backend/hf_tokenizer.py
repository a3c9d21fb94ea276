"""The chat tokenizer of a Hugging Face model: its own chat template, ending where the assistant's reply begins.

Tools render the way vLLM renders them: through the template when it handles tools (Qwen, Hermes, Llama 3.1...),
else as the Hermes system block of :mod:`agentlightning_trainer.tool_calls`, which any template can show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agentlightning_trainer.tool_calls import (
    TOOL_CALL_END,
    TOOL_CALL_START,
    has_tool_turns,
    messages_for_plain_template,
    messages_for_tool_template,
)

_TOOLS_WORD = re.compile(r"\btools\b")


def template_supports_tools(chat_template: object) -> bool:
    """Whether a chat template renders tool definitions (``tools``) and assistant ``tool_calls``.

    A template that reads neither would silently drop the tools; one that reads ``tools`` but not ``tool_calls``
    would drop the calls of earlier turns. Either way the Hermes rendering is the safe choice.
    """
    # transformers allows named templates ({"default": ..., "tool_use": ...}); it picks "tool_use" when given tools.
    sources = cast(dict[str, object], chat_template).values() if isinstance(chat_template, dict) else [chat_template]
    return any(isinstance(s, str) and _TOOLS_WORD.search(s) and "tool_calls" in s for s in sources)


class HFChatTokenizer:
    """Adapts a HF tokenizer (with its own chat template) to the policy's ``ChatTokenizer`` protocol."""

    def __init__(self, tokenizer: Any, *, stop_ids: Sequence[int] = ()) -> None:
        """Wrap a loaded ``transformers`` tokenizer; ``stop_ids`` are extra ids that end a reply (the model's EOS)."""
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; the policy renders "
                "OpenAI chat messages with it (set tokenizer.chat_template, or use an instruct/chat model)"
            )
        self._tok = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        self.stop_ids: frozenset[int] = frozenset({self.eos_id, *(int(i) for i in stop_ids)})
        self._special_tags = self._find_special_tool_tags()

    @property
    def hf(self) -> Any:
        """The wrapped ``transformers`` tokenizer."""
        return self._tok

    @property
    def supports_tools(self) -> bool:
        """Whether the model's own chat template renders tools (else the Hermes block is rendered for it)."""
        return template_supports_tools(self._tok.chat_template)

    def tool_tags_are_special(self) -> bool:
        """Whether ``<tool_call>``/``</tool_call>`` are special tokens that a plain skip-special decode would drop."""
        return bool(self._special_tags)

    def _find_special_tool_tags(self) -> dict[int, str]:
        """Ids of the tool-call tags that are single special tokens (Hermes 2 Pro adds them so), with their text."""
        tags: dict[int, str] = {}
        for tag in (TOOL_CALL_START, TOOL_CALL_END):
            ids = self.encode(tag)
            if len(ids) == 1 and not self._tok.decode(ids, skip_special_tokens=True):
                tags[ids[0]] = tag
        return tags

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without the BOS/EOS the tokenizer would add to a whole sequence."""
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Prompt token ids from the model's own chat template, ending where the assistant's reply begins.

        ``tools`` (validated by :func:`~agentlightning_trainer.tool_calls.validate_tools`) go to the template when
        it renders tools, else into the system message as the Hermes block; tool turns of the transcript are
        rendered the same way, so a multi-turn tool transcript never reaches a template that cannot show it.
        """
        chat: list[Any] = list(messages)
        options: dict[str, Any] = {}
        if tools or has_tool_turns(messages):
            if self.supports_tools:
                chat = messages_for_tool_template(messages)
                if tools:
                    options["tools"] = [dict(tool) for tool in tools]
            else:
                chat = messages_for_plain_template(messages, tools)
        ids = self._tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, **options)
        if isinstance(ids, Mapping):  # transformers >= 5 may return a BatchEncoding
            ids = cast(Mapping[str, Any], ids)["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of token ids; skipping specials keeps the tool-call tags, which are what the model said."""
        ids = [int(i) for i in ids]
        if not skip_special or not any(i in self._special_tags for i in ids):
            return str(self._tok.decode(ids, skip_special_tokens=skip_special))
        # Decode the runs between tags with the tokenizer's own skipping (it knows which added tokens are special),
        # and put the tags' text back in between (vLLM's hermes parser turns skip_special_tokens off for this reason).
        pieces: list[str] = []
        run: list[int] = []
        for token in ids:
            if token in self._special_tags:
                pieces += [str(self._tok.decode(run, skip_special_tokens=True)), self._special_tags[token]]
                run = []
            else:
                run.append(token)
        pieces.append(str(self._tok.decode(run, skip_special_tokens=True)))
        return "".join(pieces)
