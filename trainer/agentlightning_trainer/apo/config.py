"""The APO configuration: frozen, validated before any rollout runs, a description on every field."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentlightning.types import LLM, PromptTemplate


class APOConfig(BaseModel):
    """Settings of an APO run (critique-and-edit prompt optimisation with a beam search)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed_templates: dict[str, PromptTemplate] = Field(
        default_factory=dict[str, PromptTemplate],
        description="Named prompt templates to start from; empty = the PromptTemplates of the store's latest snapshot.",
    )
    optimize: tuple[str, ...] | None = Field(
        default=None, description="Names of the templates to edit; None = every seed template."
    )
    agents: str | list[str] | None = Field(
        default=None, description="Agents whose LLM calls the optimiser is shown (name, list, pattern); None = all."
    )
    optimizer_base_url: str = Field(description="OpenAI-compatible base URL of the optimiser LLM (ends in /v1).")
    optimizer_model: str = Field(description="Model name of the optimiser LLM.")
    optimizer_api_key: str = Field(default="agent-lightning", description="API key sent to the optimiser endpoint.")
    optimizer_temperature: float = Field(default=0.7, ge=0, description="Sampling temperature of optimiser calls.")
    optimizer_timeout_s: float = Field(default=120.0, gt=0, description="Timeout of one optimiser call.")
    critique_template: Path | None = Field(
        default=None, description="Jinja2 file replacing the shipped apo/prompts/critique.jinja2."
    )
    edit_template: Path | None = Field(
        default=None, description="Jinja2 file replacing the shipped apo/prompts/edit.jinja2."
    )
    agent_llm: LLM | None = Field(
        default=None,
        description="The model the agent calls; APO serves the LLM proxy in front of it (so calls and messages "
        "are recorded) and publishes it as resource `llm_resource`. None = the agent records its own calls.",
    )
    llm_resource: str = Field(default="llm", description="Resource name under which agent_llm is published.")
    agent_llm_token_ids: bool = Field(
        default=False, description="Ask agent_llm for token ids (vLLM, the policy server); public APIs reject it."
    )
    rounds: int = Field(default=3, ge=1, description="Rounds of expand (critique + edit) then select.")
    beam_width: int = Field(default=2, ge=1, description="Candidates kept after each round.")
    branch_factor: int = Field(default=2, ge=1, description="Edited children proposed per kept candidate per round.")
    train_batch_size: int = Field(default=6, ge=1, description="Training tasks each parent runs to show failures.")
    val_batch_size: int | None = Field(
        default=None, ge=1, description="Validation tasks that score each candidate; None = all of them."
    )
    max_examples: int = Field(default=4, ge=1, description="Rollouts shown to the optimiser per critique.")
    max_example_chars: int = Field(default=1500, ge=100, description="Each shown rollout is cut to this length.")
    max_template_chars: int = Field(default=20_000, ge=1, description="Longer optimiser outputs are rejected.")
    rollout_budget: int | None = Field(
        default=None, ge=1, description="Most rollouts APO may enqueue in total (train + validation); None = no cap."
    )
    target_reward: float | None = Field(default=None, description="Stop once the best validation reward reaches this.")
    seed: int = Field(default=0, description="Seeds task sampling.")
    run_dir: Path | None = Field(default=None, description="history.json and best.json go here; None = a temp dir.")
    rollout_timeout_s: float = Field(default=300.0, gt=0, description="How long one batch waits for its rollouts.")

    @model_validator(mode="after")
    def _check(self) -> APOConfig:
        if self.optimize is not None and not self.optimize:
            raise ValueError("optimize=() edits nothing; pass None to edit every seed template, or name some")
        if self.optimize is not None and self.seed_templates:
            unknown = sorted(set(self.optimize) - self.seed_templates.keys())
            if unknown:
                raise ValueError(
                    f"optimize names {unknown}, which are not among seed_templates {sorted(self.seed_templates)}"
                )
        if isinstance(self.agents, list) and not self.agents:
            raise ValueError("agents=[] shows the optimiser nothing; pass None for every call, or name the agents")
        for path in (self.critique_template, self.edit_template):
            if path is not None and not path.is_file():
                raise ValueError(f"optimiser prompt file {path} does not exist; copy one from apo/prompts/ to start")
        return self
