"""Versioned resources the agent runs with: LLM endpoints and prompt templates."""

from __future__ import annotations

import string
from functools import cached_property
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LLM(BaseModel):
    """An OpenAI-compatible model endpoint the agent calls, with the weights version it serves."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["llm"] = "llm"
    base_url: str = Field(description="OpenAI-compatible base URL ending in /v1 (or the LLM proxy's root).")
    model: str = Field(description="Model name to send in requests.")
    api_key: str | None = Field(default=None, description="Key to send; None lets the client use its default.")
    sampling: dict[str, Any] = Field(default_factory=dict, description="Sampling parameters, e.g. temperature.")
    weights_version: int | None = Field(default=None, description="Version of the weights behind the endpoint.")
    proxied: bool = Field(
        default=False,
        description="True when base_url is an Agent Lightning LLM proxy root; calls are then routed per rollout.",
    )
    agent_models: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="Model names of the agents that have weights of their own (per-agent training); every other "
        "agent uses `model`. Read it through model_for(agent).",
    )

    def model_for(self, agent: str) -> str:
        """The model name agent ``agent`` should send: its own weights' when it has them, else ``model``."""
        return self.agent_models.get(agent, self.model)

    def base_url_for(self, rollout_id: str | None, attempt_id: str | None) -> str:
        """The base URL an agent should use inside the given attempt (per-rollout path when proxied)."""
        root = self.base_url.rstrip("/")
        if not self.proxied or rollout_id is None or attempt_id is None:
            return root if root.endswith("/v1") or not self.proxied else root + "/v1"
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        return f"{root}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


class PromptTemplate(BaseModel):
    """A prompt with named placeholders, rendered with f-string (``{name}``) or jinja2 (``{{ name }}``) syntax."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["f-string", "jinja2"] = "f-string"

    @model_validator(mode="after")
    def _parses(self) -> PromptTemplate:
        try:
            _ = self.placeholders
        except Exception as exc:  # both engines raise their own error types on bad syntax
            raise ValueError(f"template does not parse as {self.engine}: {exc}") from exc
        return self

    @cached_property
    def placeholders(self) -> frozenset[str]:
        """Names the template expects."""
        if self.engine == "f-string":
            return frozenset(
                field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(self.template) if field
            )
        import jinja2
        import jinja2.meta

        env = jinja2.Environment()
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(self.template)))

    def format(self, **values: Any) -> str:
        """Render the template; a missing placeholder raises ValueError naming it."""
        missing = self.placeholders - values.keys()
        if missing:
            raise ValueError(f"prompt template needs {sorted(missing)}; got {sorted(values)}")
        if self.engine == "f-string":
            return self.template.format(**values)
        import jinja2

        return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(self.template).render(**values)


Resource: TypeAlias = Annotated[LLM | PromptTemplate, Field(discriminator="kind")]


class ResourcesSnapshot(BaseModel):
    """An immutable, versioned set of named resources; rollouts record the snapshot they ran with."""

    model_config = ConfigDict(frozen=True)

    resources_id: str
    version: int = Field(description="1 for the first snapshot of a store, then +1 per snapshot.")
    create_time: int = Field(description="Nanoseconds since the Unix epoch.")
    resources: dict[str, Resource]

    def get_llm(self, name: str | None = None) -> LLM:
        """The LLM resource called ``name``, or the only LLM when name is None."""
        return self._get(name, LLM)

    def get_prompt_template(self, name: str | None = None) -> PromptTemplate:
        """The prompt template called ``name``, or the only one when name is None."""
        return self._get(name, PromptTemplate)

    def _get(self, name: str | None, cls: type[LLM] | type[PromptTemplate]) -> Any:
        matches = {k: v for k, v in self.resources.items() if isinstance(v, cls)}
        if name is not None:
            if name not in matches:
                raise ValueError(
                    f"resources {self.resources_id} have no {cls.__name__} named {name!r}; have {sorted(matches)}"
                )
            return matches[name]
        if len(matches) != 1:
            raise ValueError(
                f"resources {self.resources_id} have {len(matches)} {cls.__name__} resources "
                f"({sorted(matches)}); name the one you want"
            )
        return next(iter(matches.values()))
