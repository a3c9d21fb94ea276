"""The user's agent as the runner sees it: the ``@rollout`` decorator and the :class:`LitAgent` base class.

A rollout function receives the task as its first positional parameter and, by parameter name:

* ``llm`` — the snapshot's LLM resource (named ``llm``, else the only one). When the LLM is proxied its
  ``base_url`` is already the per-attempt URL (:meth:`LLM.base_url_for`), so calls are recorded for this attempt;
* ``prompt_template`` — the snapshot's prompt template (named ``prompt_template``, else the only one);
* any other name of a resource in the snapshot, e.g. ``planner_llm``;
* ``rollout`` (the :class:`Rollout`), ``attempt`` (the :class:`Attempt`), ``resources`` (the whole snapshot).

It may be sync (the runner runs it in a thread) or async, and returns one of:

* a number — the rollout's reward (emitted as ``emit_reward(number)``: one dimension);
* a dict of reward dimensions, e.g. ``{"accuracy": 1.0, "brevity": 0.3}``. The first key is the primary dimension
  unless the dict holds ``"primary": "<name>"`` naming another one;
* ``None`` — the agent emitted its rewards itself with :func:`agentlightning.emit.emit_reward`.

Anything else (a string, a bool, NaN, infinity) fails the attempt with an :class:`InvalidRewardError` that says what
came back.
"""

from __future__ import annotations

import importlib
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast, overload

from agentlightning.types import LLM, Attempt, Resource, ResourcesSnapshot, Rollout

# Parameter names the runner fills from the rollout itself rather than from the resources snapshot.
_CONTEXT_PARAMETERS = ("rollout", "attempt", "resources")
# The dimension name emit_reward gives a plain number (emit.DEFAULT_REWARD_DIMENSION; not imported: OTel is heavy).
_SCALAR = "value"
# The dict key that names the primary reward dimension instead of being one.
PRIMARY_KEY = "primary"


class InvalidRewardError(ValueError):
    """An agent returned something that is not a reward (see the module docstring for what is)."""


class AgentSignatureError(TypeError):
    """A rollout function's parameters cannot be filled from the task, the rollout and its resources."""


@dataclass(frozen=True)
class Reward:
    """A normalised reward: named finite dimensions and the name of the primary one."""

    dimensions: dict[str, float]
    primary: str

    @property
    def value(self) -> float:
        """The primary dimension's value."""
        return self.dimensions[self.primary]


def _finite(name: str, value: object, returned: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRewardError(
            f"reward dimension {name!r} is {value!r} ({type(value).__name__}); the agent returned {returned!r}. "
            "Return a float, a dict of floats, or None after calling emit_reward yourself"
        )
    result = float(value)
    if not math.isfinite(result):
        raise InvalidRewardError(f"reward dimension {name!r} is {result}; rewards must be finite numbers")
    return result


def normalize_reward(returned: object) -> Reward | None:
    """Turn a rollout function's return value into a :class:`Reward` (None when it returned None)."""
    if returned is None:
        return None
    if isinstance(returned, Mapping):
        items: dict[object, object] = dict(cast("Mapping[object, object]", returned))
        primary = items.pop(PRIMARY_KEY, None)
        if not items:
            raise InvalidRewardError(f"the agent returned {returned!r}: a reward dict needs at least one dimension")
        dimensions: dict[str, float] = {}
        for key, value in items.items():
            if not isinstance(key, str):
                raise InvalidRewardError(f"reward dimension names must be strings; got {key!r} in {returned!r}")
            dimensions[key] = _finite(key, value, items)
        if primary is None:
            primary = next(iter(dimensions))
        if not isinstance(primary, str) or primary not in dimensions:
            raise InvalidRewardError(
                f"the reward dict names primary {primary!r}, which is not one of its dimensions {sorted(dimensions)}"
            )
        return Reward(dimensions, primary)
    if isinstance(returned, bool) or not isinstance(returned, int | float):
        raise InvalidRewardError(
            f"the agent returned {returned!r} ({type(returned).__name__}); a rollout function returns a float "
            "reward, a dict of reward dimensions, or None (rewards emitted with emit_reward)"
        )
    return Reward({_SCALAR: _finite(_SCALAR, returned, returned)}, _SCALAR)


def _attempt_llm(llm: LLM, rollout: Rollout, attempt: Attempt) -> LLM:
    """The LLM as this attempt must call it: a proxied LLM points at the attempt's own route on the proxy."""
    if not llm.proxied:
        return llm
    # proxied=False on the copy: its base_url is already routed, and routing it again would nest the path.
    return llm.model_copy(
        update={"base_url": llm.base_url_for(rollout.rollout_id, attempt.attempt_id), "proxied": False}
    )


def _resource_for(name: str, snapshot: ResourcesSnapshot | None) -> Resource | None:
    if snapshot is None:
        return None
    if name in snapshot.resources:
        return snapshot.resources[name]
    if name == "llm":
        llms = [r for r in snapshot.resources.values() if isinstance(r, LLM)]
        return llms[0] if len(llms) == 1 else None
    if name == "prompt_template":
        templates = [r for r in snapshot.resources.values() if not isinstance(r, LLM)]
        return templates[0] if len(templates) == 1 else None
    return None


@dataclass(frozen=True)
class _Parameter:
    name: str
    keyword: bool  # pass by keyword (False: positional-only)
    required: bool


class LitAgent(ABC):
    """Base class of agents: override :meth:`rollout`; its parameters are filled as for ``@rollout`` functions."""

    def __init__(self, name: str | None = None) -> None:
        self._name = name
        self._plan: tuple[_Parameter, ...] | None = None

    @abstractmethod
    def rollout(self, task: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run the agent on one task; return a reward, a dict of reward dimensions, or None."""

    @property
    def name(self) -> str:
        """The agent's name, for logs and reports."""
        return self._name or type(self).__name__

    def entrypoint(self) -> Callable[..., Any]:
        """The callable the runner invokes (and whose signature says what to inject)."""
        return self.rollout

    @property
    def is_async(self) -> bool:
        """True when the entrypoint is a coroutine function (awaited on the loop, not run in a thread)."""
        return inspect.iscoroutinefunction(self.entrypoint())

    def _parameters(self) -> tuple[_Parameter, ...]:
        if self._plan is None:
            self._plan = _plan_parameters(self.entrypoint(), self.name)
        return self._plan

    def bind(
        self, rollout: Rollout, attempt: Attempt, resources: ResourcesSnapshot | None
    ) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments for one attempt: the task first, then what the parameters name."""
        args: list[Any] = [rollout.input]
        kwargs: dict[str, Any] = {}
        for parameter in self._parameters():
            value = _inject(parameter, rollout, attempt, resources, self.name)
            if value is _MISSING:
                continue
            if parameter.keyword:
                kwargs[parameter.name] = value
            else:
                args.append(value)
        return args, kwargs


_MISSING: Any = object()


def _plan_parameters(function: Callable[..., Any], agent_name: str) -> tuple[_Parameter, ...]:
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not parameters or parameters[0].kind == inspect.Parameter.KEYWORD_ONLY:
        raise AgentSignatureError(
            f"agent {agent_name!r}: a rollout function takes the task as its first positional parameter, "
            f"e.g. `def agent(task, llm): ...`; its signature is {signature}"
        )
    return tuple(
        _Parameter(p.name, p.kind != p.POSITIONAL_ONLY, p.default is inspect.Parameter.empty) for p in parameters[1:]
    )


def _inject(
    parameter: _Parameter,
    rollout: Rollout,
    attempt: Attempt,
    snapshot: ResourcesSnapshot | None,
    agent_name: str,
) -> Any:
    name = parameter.name
    if name == "rollout":
        return rollout
    if name == "attempt":
        return attempt
    resource = _resource_for(name, snapshot)
    if resource is not None:
        return _attempt_llm(resource, rollout, attempt) if isinstance(resource, LLM) else resource
    if name == "resources" and snapshot is not None:
        return snapshot
    if not parameter.required:
        return _MISSING
    if snapshot is None:
        raise AgentSignatureError(
            f"agent {agent_name!r} needs parameter {name!r} but rollout {rollout.rollout_id} runs without resources; "
            f"publish them first (`agl dev`/`agl train` --upstream URL --model NAME, or --fake; in code "
            f"Trainer(llm=LLM(...)) or store.add_resources({{{name!r}: ...}})), or give {name!r} a default"
        )
    raise AgentSignatureError(
        f"agent {agent_name!r} needs parameter {name!r}, which resources {snapshot.resources_id} do not have; "
        f"resources are {sorted(snapshot.resources)} and the runner also injects {list(_CONTEXT_PARAMETERS)}, "
        "'llm' and 'prompt_template' (when the snapshot has exactly one); rename the parameter or give it a default"
    )


class FunctionAgent(LitAgent):
    """A plain function made into an agent by :func:`rollout`; calling it calls the function unchanged."""

    def __init__(self, function: Callable[..., Any], name: str | None = None) -> None:
        super().__init__(name or getattr(function, "__name__", None))
        self.function = function
        self.__doc__ = function.__doc__
        self._parameters()  # check the signature now, where the user wrote the decorator, not in a worker

    def rollout(self, task: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function."""
        return self.function(task, *args, **kwargs)

    def entrypoint(self) -> Callable[..., Any]:
        """The wrapped function itself, so its own signature drives injection."""
        return self.function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly (handy in the user's own unit tests)."""
        return self.function(*args, **kwargs)


@overload
def rollout(function: Callable[..., Any], /) -> FunctionAgent: ...
@overload
def rollout(*, name: str | None = None) -> Callable[[Callable[..., Any]], FunctionAgent]: ...
def rollout(
    function: Callable[..., Any] | None = None, /, *, name: str | None = None
) -> FunctionAgent | Callable[[Callable[..., Any]], FunctionAgent]:
    """Make a function an agent: ``@rollout`` or ``@rollout(name="solver")`` (see the module docstring)."""
    if function is not None:
        return FunctionAgent(function, name)

    def decorate(f: Callable[..., Any]) -> FunctionAgent:
        return FunctionAgent(f, name)

    return decorate


def as_agent(obj: object) -> LitAgent:
    """A :class:`LitAgent` from an agent instance, a LitAgent subclass, or a plain function."""
    if isinstance(obj, LitAgent):
        return obj
    if inspect.isclass(obj) and issubclass(obj, LitAgent):
        return obj()
    if callable(obj):  # pyright: ignore[reportUnknownArgumentType]  # any callable object is accepted here
        return FunctionAgent(cast("Callable[..., Any]", obj))
    raise TypeError(
        f"{obj!r} is not an agent; pass a function (optionally decorated with @rollout), "
        "a LitAgent instance, or a LitAgent subclass"
    )


def import_attribute(spec: str, kind: str, form: str = "'package.module:attribute'") -> object:
    """What ``"package.module:attribute"`` names (the attribute may be dotted); a ValueError about ``kind`` if not."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{kind} {spec!r} must look like {form}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import module {module_name!r} for {kind} {spec!r}: {exc}; "
            "run from the directory that holds it or install its package"
        ) from exc
    obj: object = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}; it defines {public}")
        obj = getattr(obj, part)
    return obj


def load_agent(spec: str) -> LitAgent:
    """Import an agent from ``"package.module:attribute"`` (what ``agl runner --agent`` takes)."""
    return as_agent(import_attribute(spec, "agent", "'package.module:function', e.g. 'my_agents:solve'"))
