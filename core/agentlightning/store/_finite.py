"""Keeping NaN and Infinity out of the store: JSON has no such numbers, so a stored one comes back as something else.

orjson and pydantic write a non-finite float as ``null``; a span attribute that was NaN was therefore stored as a
``null`` that the :class:`~agentlightning.types.Span` model refuses, and every later query of its rollout failed
(issue #26). Every edge now refuses them with a message naming the value: the stores' ``add_spans`` (through
:func:`~agentlightning.store._statemachine.span_attempt_keys`, which already loops over each batch), the REST
routes (orjson parses every body and refuses them, see :mod:`agentlightning.server._fast_route`) and OTLP ingest.

:func:`span_has_nonfinite` is the check on the ingest hot path (about half a microsecond for a span of eight
attributes, plus ~4 ns per item of a float list); :func:`nonfinite_span_error` then says where.
:func:`nonfinite_in_refused_json` finds where they are in a body orjson refused, for the error message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Final, TypeAlias, cast

from agentlightning.types import AttributeValue, Span, SpanEvent, SpanLink

__all__ = [
    "NO_NONFINITE",
    "Location",
    "describe_float",
    "describe_location",
    "nonfinite_in_refused_json",
    "nonfinite_location",
    "nonfinite_span_error",
    "span_has_nonfinite",
]

NO_NONFINITE: Final = "JSON has no NaN/Infinity; send a finite number (or the value as a string)"

Location: TypeAlias = tuple[str | int, ...]


def describe_float(value: float) -> str:
    """The name JSON extensions use for a non-finite float (``NaN``, ``Infinity``, ``-Infinity``)."""
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _map_has_nonfinite(attributes: Mapping[str, AttributeValue]) -> bool:
    """Whether one attribute map holds NaN or ±Infinity, as a value or inside a float list."""
    for value in attributes.values():
        cls = type(value)
        if cls is str or cls is int or cls is bool:  # most values: settled by identity checks alone
            continue
        if cls is list:
            # cast() with a string: a subscripted type would build a typing object per value (a third of the cost).
            items = cast("list[float]", value)
            # The model's list types are homogeneous, so the first item tells a float list (logprobs). sum() runs in
            # C and is non-finite when an item is; a sum that merely overflows is cleared by the item loop.
            if items and isinstance(items[0], float):
                total = sum(items)
                if total - total != 0.0 and not all(math.isfinite(item) for item in items):
                    return True
        elif isinstance(value, float) and value - value != 0.0:  # x - x is NaN exactly when x is NaN or ±inf
            return True
    return False


def span_has_nonfinite(span: Span) -> bool:
    """Whether a span holds NaN or ±Infinity: only its attribute maps can hold floats (all else is str or int)."""
    fields = span.__dict__  # one dict lookup per field instead of attribute access on the model
    if _map_has_nonfinite(fields["attributes"]):
        return True
    resource: Mapping[str, AttributeValue] = fields["resource"]
    events: list[SpanEvent] = fields["events"]
    links: list[SpanLink] = fields["links"]
    if not (resource or events or links):  # the usual span: nothing more to look at
        return False
    return (
        _map_has_nonfinite(resource)
        or any(_map_has_nonfinite(event.attributes) for event in events)
        or any(_map_has_nonfinite(link.attributes) for link in links)
    )


def _map_nonfinite(attributes: Mapping[str, AttributeValue]) -> str | None:
    """The first non-finite value of an attribute map, described (``attribute 'k' item 3 is NaN``)."""
    for key, value in attributes.items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"attribute {key!r} is {describe_float(value)}"
        if isinstance(value, list):
            for index, item in enumerate(cast(list[object], value)):
                if isinstance(item, float) and not math.isfinite(item):
                    return f"attribute {key!r} item {index} is {describe_float(item)}"
    return None


def nonfinite_span_error(span: Span, index: int | None = None) -> ValueError:
    """The error for a span holding NaN/Infinity, naming it (with its position in the batch, if given) and where."""
    found = _map_nonfinite(span.attributes)
    if found is None:
        for number, event in enumerate(span.events):
            found = _map_nonfinite(event.attributes)
            if found is not None:
                found = f"event {number} ({event.name!r}) {found}"
                break
    if found is None:
        for number, link in enumerate(span.links):
            found = _map_nonfinite(link.attributes)
            if found is not None:
                found = f"link {number} {found}"
                break
    if found is None:
        found = _map_nonfinite(span.resource)
        found = "a value is not finite" if found is None else f"resource {found}"
    which = f"span {span.span_id} ({span.name!r})" if index is None else f"span {index} ({span.span_id}, {span.name!r})"
    return ValueError(f"{which}: {found}; {NO_NONFINITE}")


def nonfinite_location(value: object) -> tuple[Location, float] | None:
    """The path to the first NaN/Infinity in a parsed JSON value, with the value; None when there is none."""
    stack: list[tuple[Location, object]] = [((), value)]
    while stack:
        location, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return location, item
        elif isinstance(item, dict):
            entries = list(cast("dict[object, object]", item).items())
            stack.extend(((*location, str(key)), entry) for key, entry in reversed(entries))
        elif isinstance(item, list):
            elements = list(enumerate(cast("list[object]", item)))
            stack.extend(((*location, index), element) for index, element in reversed(elements))
    return None


def describe_location(location: Location) -> str:
    """``spans[3].attributes['gen_ai.usage.x']`` for a location found by :func:`nonfinite_location`."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def nonfinite_in_refused_json(exc: json.JSONDecodeError) -> tuple[object, Location, float] | None:
    """For a document a strict parser (orjson) refused at a NaN/Infinity: the stdlib's parse of it and where that is.

    None when the refusal was for something else. The stdlib reads ``NaN``, ``Infinity``, ``-Infinity`` and numbers
    beyond the double range (as ±inf); it re-reads the document only when the refusal points at one of those, so a
    large malformed body is not parsed twice.
    """
    at = exc.doc[exc.pos : exc.pos + len("Infinity")]
    if not (at.startswith(("NaN", "Infinity")) or "infinity" in exc.msg):  # orjson: "number is infinity when ..."
        return None
    try:
        parsed: object = json.loads(exc.doc)
    except (ValueError, RecursionError):
        return None
    found = nonfinite_location(parsed)
    return None if found is None else (parsed, *found)
