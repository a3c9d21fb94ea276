"""Re-tokenisation of calls recorded without token ids: what the adapter and ``agl check`` need from a tokenizer.

A call that did not go through the LLM proxy (an agent traced by OpenInference, OpenLLMetry or GenAI-semconv
instrumentation, a model served elsewhere) has messages but no token ids. A :class:`Retokenizer` (the trainer's
``agentlightning_trainer.retokenize.ChatRetokenizer``, built from the policy's tokenizer) renders the recorded
messages and tools with the model's chat template, exactly as the policy server renders a request, and encodes the
reply. Whether those ids are the ones the model saw can only be checked against the lengths the serving engine
reported (``gen_ai.usage.input_tokens`` / ``output_tokens``): equal lengths = ``match``; different = ``drift``
(re-tokenising chat text for training is known to collapse rewards, so drifting calls are skipped by default); no
usage recorded = ``unverified``, which cannot be told apart from drift and is treated like it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

if TYPE_CHECKING:
    from agentlightning.adapter.calls import LLMCall

RetokenizeMode: TypeAlias = Literal["matching", "all", "off"]
"""Which re-tokenised calls train: ``matching`` (usage counts agree), ``all``, or none (``off``)."""
Verdict: TypeAlias = Literal["match", "drift", "unverified", "failed"]

FIX_DRIFT = (
    "route the model through the LLM proxy (LLM.base_url_for) so the engine's token ids are recorded, or set "
    "LightningRLConfig(retokenize='all') to train them anyway"
)


@dataclass(frozen=True, slots=True)
class Retokenized:
    """A call's re-tokenised prompt and reply, with the lengths the serving engine recorded to check them against."""

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    recorded_input_tokens: int | None = None
    recorded_output_tokens: int | None = None
    error: str | None = None
    """Why the call could not be rendered (no messages recorded, a role the template rejects); ids are then empty."""

    @property
    def verdict(self) -> Verdict:
        """``match``, ``drift`` (a recorded length differs), ``unverified`` (no usage recorded) or ``failed``."""
        if self.error is not None or not self.prompt_token_ids or not self.response_token_ids:
            return "failed"
        if self.recorded_input_tokens is None or self.recorded_output_tokens is None:
            return "unverified"
        if self.recorded_input_tokens != len(self.prompt_token_ids) or self.recorded_output_tokens != len(
            self.response_token_ids
        ):
            return "drift"
        return "match"

    def lengths(self) -> str:
        """Recorded against re-tokenised lengths, as a message shows them: ``recorded 41+3 tokens, re-tokenised
        39+3``."""
        recorded = f"{_or_unknown(self.recorded_input_tokens)}+{_or_unknown(self.recorded_output_tokens)}"
        return f"recorded {recorded} tokens, re-tokenised {len(self.prompt_token_ids)}+{len(self.response_token_ids)}"


def _or_unknown(value: int | None) -> str:
    return "?" if value is None else str(value)


class Retokenizer(Protocol):
    """Renders a recorded call into (prompt, reply) token ids with the trained model's tokenizer."""

    def __call__(self, call: LLMCall) -> Retokenized:
        """The call's re-tokenised ids and recorded lengths; ``error`` set when it cannot be rendered."""
        ...


def trains(result: Retokenized, mode: RetokenizeMode) -> bool:
    """Whether a re-tokenised call becomes a training row under ``mode``."""
    verdict = result.verdict
    if mode == "off" or verdict == "failed":
        return False
    return verdict == "match" or mode == "all"


@dataclass(slots=True)
class RetokenizeCounts:
    """How many calls without token ids were re-tokenised, by verdict, and what became of them."""

    retokenized: int = 0
    """Calls rendered (every verdict but ``failed``)."""
    matched: int = 0
    drift: int = 0
    unverified: int = 0
    failed: int = 0
    trained: int = 0
    skipped_drift: int = 0
    skipped_no_usage: int = 0

    def add(self, result: Retokenized, mode: RetokenizeMode) -> bool:
        """Count one result; True when it trains under ``mode``."""
        verdict = result.verdict
        used = trains(result, mode)
        if verdict == "failed":
            self.failed += 1
            return False
        self.retokenized += 1
        self.trained += used
        if verdict == "match":
            self.matched += 1
        elif verdict == "drift":
            self.drift += 1
            self.skipped_drift += not used
        else:
            self.unverified += 1
            self.skipped_no_usage += not used
        return used

    def metrics(self) -> dict[str, float]:
        """Step metrics: re-tokenised, trained, drifting; skipped for drift, for missing usage, unrenderable."""
        return {
            "retokenized": float(self.retokenized),
            "retokenized_trained": float(self.trained),
            "retokenize_drift": float(self.drift),
            "retokenize_skipped_drift": float(self.skipped_drift),
            "retokenize_skipped_no_usage": float(self.skipped_no_usage),
            "retokenize_failed": float(self.failed),
        }
