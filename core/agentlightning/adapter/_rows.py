"""Fast ``Transition`` construction for the adapter's hot loop (trusted, already-typed values)."""

from __future__ import annotations

from typing import Any

from agentlightning.types import Transition

_FIELDS = frozenset(Transition.model_fields)
# One set shared by every row: every field is set, so pydantic's only write to it (adding an assigned field's
# name) never changes it; sharing saves an allocation per row, which the garbage collector would otherwise scan.
_ALL_SET = set(_FIELDS)


def _construct_fast(values: dict[str, Any]) -> Transition:
    # What model_construct ends with, without its per-field alias scan (~10x faster for 15 fields).
    row = Transition.__new__(Transition)
    object.__setattr__(row, "__dict__", values)
    object.__setattr__(row, "__pydantic_fields_set__", _ALL_SET)
    object.__setattr__(row, "__pydantic_extra__", None)
    object.__setattr__(row, "__pydantic_private__", None)
    return row


def _construct_safe(values: dict[str, Any]) -> Transition:
    return Transition.model_construct(**values)


def _fast_path_works() -> bool:
    """True when the fast path builds the same model as pydantic's own constructor (pydantic internals may move)."""
    sample: dict[str, Any] = {
        "rollout_id": "ro-1",
        "attempt_id": "at-1",
        "group_id": "g",
        "agent_name": None,
        "turn_index": 0,
        "span_id": "0" * 16,
        "prompt_token_ids": [1],
        "response_token_ids": [2],
        "response_logprobs": None,
        "reward": 1.0,
        "advantage": None,
        "response_advantages": None,
        "policy_version": None,
        "prompt_messages": None,
        "response_messages": None,
        "response_mask": None,
    }
    if frozenset(sample) != _FIELDS:
        return False
    try:
        fast = _construct_fast(dict(sample))
        slow = Transition.model_validate(sample)
        copied = fast.model_copy(update={"advantage": 0.5})
        return fast == slow and fast.model_dump() == slow.model_dump() and copied.advantage == 0.5
    except Exception:  # any failure means pydantic changed its internals: use the public constructor
        return False


new_transition = _construct_fast if _fast_path_works() else _construct_safe
"""Build a Transition from a dict holding every field, already of the right type (no validation)."""


def with_updates(row: Transition, updates: dict[str, Any]) -> Transition:
    """A shallow copy of ``row`` with some fields replaced (lists are shared, as with ``model_copy``)."""
    values = dict(row.__dict__)
    values.update(updates)
    return new_transition(values)
