"""The SFT configuration: frozen, validated before any model is built, a description on every field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentlightning_trainer.config import LightningRLConfig, PolicySpec

Selection = Literal["threshold", "top_k"]
TokenLevel = Literal["auto", "always", "never"]


class SFTConfig(BaseModel):
    """Settings of an SFT run: sample, keep the best rollouts per task, fine-tune on them, publish, repeat."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: PolicySpec = Field(default_factory=PolicySpec, description="The model to fine-tune and serve.")
    rounds: int = Field(default=3, ge=1, description="Rounds of sample → select → fine-tune → publish.")
    tasks_per_round: int | None = Field(
        default=None, ge=1, description="Tasks sampled each round; None = every training task."
    )
    samples_per_task: int = Field(default=8, ge=1, description="K: rollouts per task each round.")
    selection: Selection = Field(
        default="top_k", description="'threshold': every rollout >= min_reward; 'top_k': the k best >= min_reward."
    )
    top_k: int = Field(default=2, ge=1, description="Rollouts kept per task with selection='top_k'.")
    min_reward: float = Field(default=1.0, description="Rollouts below this reward are never imitated.")
    agents: str | list[str] | None = Field(
        default=None, description="Agents whose calls become examples (name, list, pattern); None = every call."
    )
    token_level: TokenLevel = Field(
        default="auto",
        description="'auto': the engine's token ids when a call has them, else the chat messages re-tokenised; "
        "'always': skip calls without ids; 'never': always re-tokenise the messages.",
    )
    accumulate: bool = Field(
        default=True,
        description="Train each round on every example selected so far (expert iteration), not only this round's; "
        "steadier when successes are rare.",
    )
    epochs: int = Field(default=3, ge=1, description="Passes over each round's examples.")
    mini_batch_size: int = Field(default=32, ge=1, description="Examples per optimizer step.")
    lr: float = Field(default=1e-3, gt=0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient-norm clip.")
    max_prompt_tokens: int = Field(default=192, ge=1, description="Examples with longer prompts are dropped.")
    max_response_tokens: int = Field(default=6, ge=1, description="max_tokens sent with every sampling request.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of training rollouts.")
    val_every: int = Field(default=1, ge=1, description="Validate (greedy) every this many rounds, and at the end.")
    seed: int = Field(default=0, description="Seeds the model init, mini-batch order and task order.")
    rollout_timeout_s: float = Field(default=300.0, gt=0, description="How long one batch waits for its rollouts.")

    @model_validator(mode="after")
    def _check(self) -> SFTConfig:
        if (
            self.policy.kind == "tiny_gpt"
            and self.max_prompt_tokens + self.max_response_tokens > self.policy.max_seq_len
        ):
            raise ValueError(
                f"max_prompt_tokens {self.max_prompt_tokens} + max_response_tokens {self.max_response_tokens} "
                f"exceeds the tiny GPT's max_seq_len {self.policy.max_seq_len}; lower one or raise policy.max_seq_len"
            )
        if isinstance(self.agents, list) and not self.agents:
            raise ValueError("agents=[] imitates nothing; pass None for every call, or name the agents")
        return self

    def learner_config(self) -> LightningRLConfig:
        """The torch learner's settings (its AdamW, checkpoints and weight files are reused as they are)."""
        return LightningRLConfig(
            policy=self.policy,
            lr=self.lr,
            weight_decay=self.weight_decay,
            max_grad_norm=self.max_grad_norm,
            max_prompt_tokens=self.max_prompt_tokens,
            max_response_tokens=self.max_response_tokens,
            seed=self.seed,
        )
