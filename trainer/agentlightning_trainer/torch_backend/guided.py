"""Guided decoding: a reply's first tokens restricted to a few choices (a token trie), then free text.

The policy server uses it for ``tool_choice="required"`` (see ``agentlightning_trainer.tool_calls``): the model
picks the function name among the allowed tools and writes the arguments until their JSON object closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Guide:
    """Guided decoding of one reply: its first tokens spell one of ``choices`` (token sequences, none a prefix of
    another), sampled among those only; after that the model writes freely until EOS, ``stop_text`` or the budget,
    or, with ``close_json`` (the choices end inside a JSON object, as a tool call's ``"arguments": {``), until that
    object closes. A choice listed in ``complete`` ends the reply where it ends (a call whose arguments are fixed).

    Recorded logprobs stay the model's own (unrestricted) ones, which the learner recomputes, as with vLLM's guided
    decoding under verl; a token with a single allowed continuation is forced.
    """

    choices: tuple[tuple[int, ...], ...]
    stop_text: str | None = None
    close_json: bool = False
    complete: frozenset[int] = frozenset()
    """Indices of the choices that are whole replies."""

    def __post_init__(self) -> None:
        """Reject choices a trie cannot tell apart."""
        if not self.choices or any(not c for c in self.choices):
            raise ValueError("a Guide needs at least one non-empty token sequence")
        for a in self.choices:
            for c in self.choices:
                if a is not c and len(a) <= len(c) and c[: len(a)] == a:
                    raise ValueError(f"guide choice {list(a)} is a prefix of {list(c)}; end each with a delimiter")

    def trie(self) -> dict[int, Any]:
        """The choices as nested dicts token id -> subtree; a leaf is an empty dict, or ``{END: True}`` for a
        choice that is a whole reply."""
        root: dict[int, Any] = {}
        for index, choice in enumerate(self.choices):
            node = root
            for token in choice:
                node = node.setdefault(token, {})
            if index in self.complete:
                node[END] = True
        return root


END = -1  # a trie key no token id takes: the choice ending here is the whole reply


class JsonDepth:
    """Tracks the brace depth of JSON text fed piece by piece, from inside one object; says when it closes."""

    def __init__(self) -> None:
        """Start one object deep, outside any string."""
        self.depth = 1
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> bool:
        """Consume ``text``; True once the object that was open at the start has closed."""
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return True
        return False
