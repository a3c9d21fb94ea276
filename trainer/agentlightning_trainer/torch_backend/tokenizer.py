"""A character/word tokenizer built in code, with a chat template rendering OpenAI messages to text."""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

from agentlightning_trainer.tool_calls import assistant_calls, content_text, format_tool_call, tool_names

# Special tokens. The chat template writes role markers as single tokens so that prompts stay short and the model
# never has to learn to spell them.
PAD = "<|pad|>"
BOS = "<|bos|>"
END = "<|end|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, END, SYSTEM, USER, ASSISTANT)
_ROLE_TOKENS = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": USER}


def message_text(message: Mapping[str, Any]) -> str:
    """The text of an OpenAI chat message whose content is a string or a list of text parts."""
    return content_text(message.get("content"))


class WordCharTokenizer:
    """Whole-word tokens for a fixed word list, single characters for everything else, plus chat specials.

    Encoding is greedy longest match at each position, so any printable ASCII text round-trips; words in the list
    (e.g. tool names) cost one token, which lets a randomly initialised model hit them by chance.
    """

    def __init__(self, words: Sequence[str] = ()) -> None:
        """Build the vocabulary: specials, printable ASCII characters, then ``words`` (deduplicated, in order)."""
        chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
        vocab: list[str] = list(SPECIAL_TOKENS)
        seen = set(vocab)
        for piece in [*chars, *words]:
            if piece and piece not in seen:
                vocab.append(piece)
                seen.add(piece)
        self.words: tuple[str, ...] = tuple(w for w in words if len(w) > 1)
        self.vocab: tuple[str, ...] = tuple(vocab)
        self._ids = {piece: i for i, piece in enumerate(vocab)}
        self._max_len = max(len(p) for p in vocab)
        self.pad_id = self._ids[PAD]
        self.bos_id = self._ids[BOS]
        self.eos_id = self._ids[END]

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (specials written literally are encoded as specials); unknown chars become '?'."""
        ids: list[int] = []
        i = 0
        while i < len(text):
            for length in range(min(self._max_len, len(text) - i), 0, -1):
                token = self._ids.get(text[i : i + length])
                if token is not None and (length > 1 or text[i] in self._ids):
                    ids.append(token)
                    i += length
                    break
            else:
                ids.append(self._ids["?"])
                i += 1
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; specials are dropped unless ``skip_special`` is False."""
        out: list[str] = []
        for token in ids:
            piece = self.vocab[token] if 0 <= token < len(self.vocab) else "?"
            if skip_special and piece in SPECIAL_TOKENS:
                continue
            out.append(piece)
        return "".join(out)

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> str:
        """The chat template: ``<|bos|>`` then ``<|role|>text<|end|>`` per message, then ``<|assistant|>``.

        With ``tools`` a compact line ``<|system|>tools: add, search<|end|>`` follows ``<|bos|>``: the tiny GPT's
        context is ~256 tokens, too short for the Hermes block with its schemas. An assistant's ``tool_calls``
        follow its text as compact calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, what the
        policy server parses back; add a whole call string to ``words`` to make it one token); tool results are
        user turns, as before.
        """
        parts = [BOS]
        if tools:
            parts.append(f"{SYSTEM}tools: {', '.join(tool_names(tools))}{END}")
        for message in messages:
            role = str(message.get("role", "user"))
            if role not in _ROLE_TOKENS:
                raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(_ROLE_TOKENS)}")
            text = message_text(message)
            if role == "assistant" and message.get("tool_calls"):
                text += "".join(format_tool_call(name, args, compact=True) for name, args in assistant_calls(message))
            parts.append(f"{_ROLE_TOKENS[role]}{text}{END}")
        parts.append(ASSISTANT)
        return "".join(parts)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the rendered chat prompt (:meth:`render_chat`), ending where the assistant's reply begins."""
        return self.encode(self.render_chat(messages, tools))

    def to_config(self) -> dict[str, Any]:
        """JSON-serialisable description from which :meth:`from_config` rebuilds an identical tokenizer."""
        return {"words": list(self.words)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WordCharTokenizer:
        """Rebuild a tokenizer from :meth:`to_config` output."""
        return cls(words=list(config.get("words", [])))
