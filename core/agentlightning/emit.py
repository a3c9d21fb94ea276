"""Helpers an agent calls to record rewards, messages, objects, exceptions, annotations and operations as spans.

Every helper creates a span through the process-wide tracer (:func:`agentlightning.tracing.init_tracing`), so it
is stamped with the current rollout/attempt and delivered with the agent's other spans. Attribute names are those
of :mod:`agentlightning.semconv`; a reward is a span named ``agentlightning.reward`` with one
``agentlightning.reward.<name>`` float per dimension and ``agentlightning.reward.primary`` naming the primary one.

**Outside a rollout** the ``emit_*`` helpers follow the environment variable ``AGENTLIGHTNING_EMIT_OUTSIDE_ROLLOUT``:

- ``error`` (default): raise :class:`OutsideRolloutError`, which says how to run inside a rollout;
- ``warn``: issue an :class:`OutsideRolloutWarning` and record nothing (return None);
- ``ignore``: record nothing (return None).

Inside a rollout a reward is never dropped silently: when no tracer is initialised the helpers raise
:class:`RuntimeError` instead of writing into the void. Malformed input raises :class:`ValueError` naming the field,
inside or outside a rollout. :func:`operation` never raises on its own account: it wraps the user's code, whose
exceptions are recorded on the span and re-raised unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from numbers import Real
from types import TracebackType
from typing import Any, Final, Literal, ParamSpec, TypeVar, cast, overload

import pydantic_core
from opentelemetry import context as context_api, trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Status, StatusCode

from agentlightning import semconv
from agentlightning.tracing import current_rollout, get_lightning_tracer, get_tracer
from agentlightning.types.spans import AttributeValue, Span

__all__ = [
    "DEFAULT_REWARD_DIMENSION",
    "EMIT_OUTSIDE_ROLLOUT_ENV",
    "OPERATION_INPUT",
    "OPERATION_OUTPUT",
    "Operation",
    "OutsideRolloutError",
    "OutsideRolloutWarning",
    "Reward",
    "emit_annotation",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "final_reward",
    "find_rewards",
    "operation",
]

logger = logging.getLogger("agentlightning.emit")

EMIT_OUTSIDE_ROLLOUT_ENV: Final = "AGENTLIGHTNING_EMIT_OUTSIDE_ROLLOUT"
DEFAULT_REWARD_DIMENSION: Final = "value"
"""Dimension name of a scalar reward (``emit_reward(0.5)`` → ``agentlightning.reward.value``)."""
OPERATION_INPUT: Final = "agentlightning.operation.input"
"""JSON object of an operation's arguments (name → value)."""
OPERATION_OUTPUT: Final = "agentlightning.operation.output"
"""JSON of an operation's return value."""

_TRACER_NAME: Final = "agentlightning.emit"
_OUTSIDE_MODES: Final = ("error", "warn", "ignore")

P = ParamSpec("P")
R = TypeVar("R")


class OutsideRolloutError(RuntimeError):
    """An emit helper was called outside a rollout while ``AGENTLIGHTNING_EMIT_OUTSIDE_ROLLOUT=error``."""


class OutsideRolloutWarning(UserWarning):
    """An emit helper was called outside a rollout while ``AGENTLIGHTNING_EMIT_OUTSIDE_ROLLOUT=warn``."""


# --- emit helpers -------------------------------------------------------------------------------------------------
def emit_reward(
    value: float | Mapping[str, float],
    *,
    primary: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> ReadableSpan | None:
    """Record a reward: a float, or named dimensions with ``primary`` naming the one the trainer optimises."""
    dimensions, primary_name = _validate_reward(value, primary)
    extra = dict(attributes or {})
    for key in extra:
        if key.startswith(semconv.REWARD_PREFIX):
            raise ValueError(
                f"attributes: key {key!r} is reserved for reward dimensions; pass dimensions in value instead"
            )
    if not _inside_rollout("emit_reward"):
        return None
    span_attributes: dict[str, AttributeValue] = {**extra, semconv.SPAN_SOURCE: semconv.SOURCE_EMIT}
    span_attributes.update({semconv.reward_attribute(name): v for name, v in dimensions.items()})
    span_attributes[semconv.REWARD_PRIMARY] = primary_name
    return _record(semconv.SPAN_REWARD, span_attributes)


def emit_message(text: str) -> ReadableSpan | None:
    """Record a free-text message (a log line worth keeping with the rollout)."""
    if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]  # callers may be untyped
        raise ValueError(f"text: emit_message takes a str, got {type(text).__name__}; use emit_object for data")
    if not _inside_rollout("emit_message"):
        return None
    return _record(semconv.SPAN_MESSAGE, {semconv.MESSAGE_BODY: text})


def emit_object(obj: Any) -> ReadableSpan | None:
    """Record any JSON-serialisable object (pydantic models, dataclasses, dicts, lists, ...)."""
    try:
        body = pydantic_core.to_json(obj).decode()
    except pydantic_core.PydanticSerializationError as exc:
        raise ValueError(f"obj: {type(obj).__name__} is not JSON-serialisable ({exc}); convert it first") from exc
    if not _inside_rollout("emit_object"):
        return None
    return _record(semconv.SPAN_OBJECT, {semconv.OBJECT_JSON: body})


def emit_exception(exc: BaseException) -> ReadableSpan | None:
    """Record an exception (type, message, traceback) as an error span without raising it."""
    if not isinstance(exc, BaseException):  # pyright: ignore[reportUnnecessaryIsInstance]  # callers may be untyped
        raise ValueError(f"exc: emit_exception takes an exception instance, got {type(exc).__name__}")
    if not _inside_rollout("emit_exception"):
        return None
    span = get_tracer(_TRACER_NAME).start_span(
        semconv.SPAN_EXCEPTION,
        attributes={semconv.SPAN_SOURCE: semconv.SOURCE_EMIT, semconv.ERROR_TYPE: type(exc).__qualname__},
    )
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.end()
    return span if isinstance(span, ReadableSpan) else None


def emit_annotation(**annotations: Any) -> ReadableSpan | None:
    """Record key/value annotations; non-primitive values are stored as JSON strings."""
    if not annotations:
        raise ValueError("annotations: emit_annotation needs at least one key=value, e.g. emit_annotation(step=3)")
    attributes: dict[str, AttributeValue] = {semconv.SPAN_SOURCE: semconv.SOURCE_EMIT}
    for key, value in annotations.items():
        attributes[semconv.ANNOTATION_PREFIX + key] = _attribute_value(value)
    if not _inside_rollout("emit_annotation"):
        return None
    return _record(semconv.SPAN_ANNOTATION, attributes)


# --- operation ------------------------------------------------------------------------------------------------------
class Operation:
    """A span around a block (``with`` / ``async with``) or around every call of a decorated function.

    Inputs and the output are recorded as JSON in ``agentlightning.operation.input`` / ``.output``; an exception
    is recorded on the span (status ERROR, ``error.type``) and re-raised unchanged. Spans started inside are its
    children. Not for generator functions: the span would end before the generator runs.
    """

    def __init__(
        self, name: str | None = None, *, attributes: Mapping[str, AttributeValue] | None = None, record_io: bool = True
    ) -> None:
        self.name = name
        self._attributes = dict(attributes or {})
        self._record_io = record_io
        self._active: _ActiveOperation | None = None

    # -- context manager ----------------------------------------------------------------------------------------------
    def __enter__(self) -> Operation:
        if self._active is not None:
            raise RuntimeError(f"operation {self.name!r} is already active; create one Operation per with-block")
        self._active = _ActiveOperation.start(self.name or "block", self._attributes)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        active, self._active = self._active, None
        if active is not None:
            active.finish(exc)
        return False

    async def __aenter__(self) -> Operation:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        return self.__exit__(exc_type, exc, tb)

    def set_input(self, **inputs: Any) -> None:
        """Record the block's inputs (inside ``with``)."""
        if self._active is not None and self._record_io:
            self._active.set_json(OPERATION_INPUT, inputs)

    def set_output(self, output: Any) -> None:
        """Record the block's output (inside ``with``)."""
        if self._active is not None and self._record_io:
            self._active.set_json(OPERATION_OUTPUT, output)

    @property
    def span(self) -> trace_api.Span | None:
        """The span of the active with-block, or None outside it."""
        return None if self._active is None else self._active.span

    # -- decorator --------------------------------------------------------------------------------------------------
    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Wrap ``func`` (sync or async) so that every call is recorded as an operation span."""
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise ValueError(
                f"operation cannot wrap generator function {func.__qualname__}: the span would end before it runs; "
                "use `with operation(...)` around the code that consumes it"
            )
        name = self.name or func.__qualname__
        attributes = self._attributes
        record_io = self._record_io
        signature = _signature(func)

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _ActiveOperation:
            active = _ActiveOperation.start(name, attributes)
            if record_io:
                active.set_json(OPERATION_INPUT, _call_arguments(signature, args, kwargs))
            return active

        if inspect.iscoroutinefunction(func):
            async_func = cast(Callable[..., Any], func)

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                active = begin(args, kwargs)
                try:
                    result = await async_func(*args, **kwargs)
                except BaseException as exc:
                    active.finish(exc)
                    raise
                if record_io:
                    active.set_json(OPERATION_OUTPUT, result)
                active.finish(None)
                return result

            return cast(Callable[P, R], async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            active = begin(args, kwargs)
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                active.finish(exc)
                raise
            if record_io:
                active.set_json(OPERATION_OUTPUT, result)
            active.finish(None)
            return result

        return wrapper


@overload
def operation(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def operation(
    name: str | None = None, /, *, attributes: Mapping[str, AttributeValue] | None = None, record_io: bool = True
) -> Operation: ...
def operation(
    target: Callable[P, R] | str | None = None,
    /,
    *,
    attributes: Mapping[str, AttributeValue] | None = None,
    record_io: bool = True,
) -> Callable[P, R] | Operation:
    """Trace a function (``@operation`` / ``@operation("name")``) or a block (``with operation("name") as op:``)."""
    if target is None or isinstance(target, str):
        return Operation(target, attributes=attributes, record_io=record_io)
    return Operation(attributes=attributes, record_io=record_io)(target)


class _ActiveOperation:
    """One running operation span, current in the context until finished. Never raises on its own account."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace_api.Span, token: object) -> None:
        self.span = span
        self.token = token

    @classmethod
    def start(cls, name: str, attributes: Mapping[str, AttributeValue]) -> _ActiveOperation:
        span = get_tracer(_TRACER_NAME).start_span(
            semconv.SPAN_OPERATION_PREFIX + name, attributes={**attributes, semconv.SPAN_SOURCE: semconv.SOURCE_EMIT}
        )
        return cls(span, context_api.attach(trace_api.set_span_in_context(span)))

    def set_json(self, key: str, value: Any) -> None:
        # fallback=repr: an argument we cannot serialise must not break the user's function
        self.span.set_attribute(key, pydantic_core.to_json(value, fallback=repr).decode())

    def finish(self, exc: BaseException | None) -> None:
        try:
            context_api.detach(self.token)  # pyright: ignore[reportArgumentType]  # the token attach() returned
        except Exception:  # detaching in another context (a misused with-block) must not mask the user's result
            logger.debug("agentlightning: could not detach operation context", exc_info=True)
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_attribute(semconv.ERROR_TYPE, type(exc).__qualname__)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()


def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return None


def _call_arguments(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Arguments by parameter name (without self/cls), or raw args/kwargs when they do not bind."""
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # the call itself is wrong; the function raises its own error right after
            pass
        else:
            return {name: value for name, value in bound.arguments.items() if name not in ("self", "cls")}
    return {"args": list(args), "kwargs": kwargs}


# --- readers ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reward:
    """One reward span read back: all dimensions, the primary one and its value."""

    dimensions: dict[str, float]
    primary: str | None
    value: float | None
    span: Span


def find_rewards(spans: Iterable[Span]) -> list[Reward]:
    """Rewards among ``spans`` of one attempt, ordered by sequence id, then end time."""
    rewards: list[Reward] = []
    for span in sorted((s for s in spans if s.name == semconv.SPAN_REWARD), key=_reward_order):
        dimensions: dict[str, float] = {}
        for key, value in span.attributes.items():
            if (
                key.startswith(semconv.REWARD_PREFIX)
                and key != semconv.REWARD_PRIMARY
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            ):
                dimensions[key.removeprefix(semconv.REWARD_PREFIX)] = float(value)
        primary = span.attributes.get(semconv.REWARD_PRIMARY)
        if not isinstance(primary, str) and len(dimensions) == 1:
            primary = next(iter(dimensions))
        primary_name = primary if isinstance(primary, str) and primary in dimensions else None
        value = dimensions[primary_name] if primary_name is not None else None
        rewards.append(Reward(dimensions=dimensions, primary=primary_name, value=value, span=span))
    return rewards


def final_reward(spans: Iterable[Span]) -> float | None:
    """Primary value of the last reward (by sequence id, then time) that has one; None when there is none."""
    for reward in reversed(find_rewards(spans)):
        if reward.value is not None:
            return reward.value
    return None


def _reward_order(span: Span) -> tuple[int, int, int]:
    return (span.sequence_id, span.end_time or span.start_time, span.start_time)


# --- internals ------------------------------------------------------------------------------------------------------
def _validate_reward(value: Any, primary: str | None) -> tuple[dict[str, float], str]:
    """Check a reward and return its dimensions and primary name; ValueError names the offending field."""
    if isinstance(value, Mapping):
        raw = cast(Mapping[Any, Any], value)
        if not raw:
            raise ValueError("value: reward dict is empty; pass at least one dimension, e.g. {'accuracy': 1.0}")
        dimensions = {_dimension_name(name): _reward_float(v, f"value[{name!r}]") for name, v in raw.items()}
        if primary is None:
            if len(dimensions) > 1:
                raise ValueError(
                    f"primary: the reward has {len(dimensions)} dimensions ({', '.join(map(repr, dimensions))}); "
                    "pass primary=<name> to say which one the trainer optimises"
                )
            primary = next(iter(dimensions))
        elif primary not in dimensions:
            raise ValueError(
                f"primary: {primary!r} is not a dimension of the reward; dimensions are "
                f"{', '.join(map(repr, dimensions))}"
            )
        return dimensions, primary
    name = DEFAULT_REWARD_DIMENSION if primary is None else _dimension_name(primary, field="primary")
    return {name: _reward_float(value, "value")}, name


def _dimension_name(name: Any, *, field: str = "value") -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{field}: reward dimension names must be non-empty strings, got {name!r}")
    if name == "primary":
        raise ValueError(
            f"{field}: 'primary' cannot be a reward dimension name: {semconv.REWARD_PRIMARY} names the primary "
            "dimension; rename it (e.g. 'main')"
        )
    return name


def _reward_float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{field}: a reward must be a finite number, got {type(value).__name__} {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{field}: a reward must be finite, got {result}")
    return result


def _attribute_value(value: Any) -> AttributeValue:
    """A span attribute value: primitives and homogeneous lists as they are, everything else as JSON."""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        items = list(cast(Iterable[Any], value))
        kinds: set[type] = {type(item) for item in items}
        if items and len(kinds) == 1 and kinds <= {str, bool, int, float}:
            return cast(AttributeValue, items)
    return pydantic_core.to_json(value, fallback=repr).decode()


def _inside_rollout(helper: str) -> bool:
    """True when the helper should record; applies the outside-rollout flag otherwise."""
    rollout = current_rollout()
    if rollout is not None:
        if get_lightning_tracer() is None:
            raise RuntimeError(
                f"{helper} inside rollout {rollout.rollout_id} (attempt {rollout.attempt_id}) has nowhere to go: no "
                "tracer is initialised; call agentlightning.tracing.init_tracing(sink) first (runners do this)"
            )
        return True
    raw = os.environ.get(EMIT_OUTSIDE_ROLLOUT_ENV, "error")
    mode = raw.strip().lower() or "error"
    if mode not in _OUTSIDE_MODES:
        raise ValueError(f"{EMIT_OUTSIDE_ROLLOUT_ENV}={raw!r} is not one of {', '.join(_OUTSIDE_MODES)}")
    message = (
        f"{helper} was called outside a rollout, so its span belongs to no attempt. Run the agent through a runner "
        "(or Trainer.dev), or wrap the call in `with agentlightning.rollout_context(rollout_id, attempt_id):`. "
        f"To allow this, set {EMIT_OUTSIDE_ROLLOUT_ENV}=warn or ignore."
    )
    if mode == "error":
        raise OutsideRolloutError(message)
    if mode == "warn":
        warnings.warn(message, OutsideRolloutWarning, stacklevel=3)
    return False


def _record(name: str, attributes: Mapping[str, AttributeValue]) -> ReadableSpan | None:
    span = get_tracer(_TRACER_NAME).start_span(
        name, attributes={semconv.SPAN_SOURCE: semconv.SOURCE_EMIT, **attributes}
    )
    span.end()
    return span if isinstance(span, ReadableSpan) else None
