# pyright: reportMissingImports=false
# (verl, hydra and omegaconf come with the optional [verl] extra, absent from the main environment pyright checks)
"""Our transitions → verl's padded training batch (a ``DataProto``), advantages placed per token.

The layout is the one verl's own agent loop produces (``verl.experimental.agent_loop``): prompts left-padded,
responses right-padded, ``attention_mask`` 1 on every real token (observation tokens included), ``position_ids``
the cumulative attention mask, ``response_mask`` 1 on model tokens only, the reward on the last response token.
verl recovers response lengths from ``attention_mask`` (``no_padding_2_padding``), so real response tokens must be
one contiguous run from the left; observation tokens inside it are masked out of the loss by ``response_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from agentlightning.adapter import LossAggregation, loss_token_weights
from agentlightning.types import Transition

if TYPE_CHECKING:
    from verl import DataProto

PAD_UID = "__agentlightning_padding__"
"""``uid`` of filler rows added to make the batch divide evenly across data-parallel ranks (loss mask all 0)."""


@dataclass(frozen=True)
class BatchTensors:
    """The tensors of one training batch, before they are wrapped as verl's ``DataProto``."""

    tensors: dict[str, torch.Tensor]
    uids: list[str]
    rollout_ids: list[str]
    real_rows: int
    truncated_responses: int


def token_advantage_scales(transitions: Sequence[Transition], aggregation: LossAggregation | str) -> list[float]:
    """Per-transition factor on the advantage so that verl's ``token-mean`` loss computes ``aggregation``.

    The clipped PPO objective is positively homogeneous in the advantage, so scaling a row's advantage by ``c``
    scales its token losses by ``c``. ``token-mean`` needs no scaling; ``rollout-mean`` (each rollout weighs the
    same, however many calls or tokens it has) multiplies by ``total_tokens / (rollouts * tokens_of_rollout)``.
    Exact when one mini-batch holds the whole step, as our default settings do.
    """
    mode = LossAggregation(aggregation)
    if mode is LossAggregation.TOKEN_MEAN:
        return [1.0] * len(transitions)
    weights = loss_token_weights(transitions, mode)
    total = sum(sum(t.response_mask) if t.response_mask is not None else len(t.response_token_ids) for t in transitions)
    return [w * total for w in weights]


def build_batch_tensors(
    transitions: Sequence[Transition],
    *,
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    loss_aggregation: LossAggregation | str = LossAggregation.TOKEN_MEAN,
    size_multiple: int = 1,
) -> BatchTensors:
    """Pad ``transitions`` (advantages set) into verl's tensors; widths default to the batch's longest row.

    A prompt longer than ``prompt_length`` is an error (the trainer drops those before); a response longer than
    ``response_length`` is cut and counted in ``truncated_responses``. ``size_multiple`` appends filler rows
    (copies of the first row with an all-zero ``response_mask``, ``uid`` :data:`PAD_UID`) so the batch divides
    across data-parallel ranks without weighing any real row twice.
    """
    if not transitions:
        raise ValueError("cannot build a training batch from no transitions")
    for t in transitions:
        if t.advantage is None:
            raise ValueError(
                f"transition {t.rollout_id}/{t.turn_index} has no advantage; compute them first "
                "(agentlightning.adapter.grpo_advantages)"
            )
        if not t.has_token_ids:
            raise ValueError(
                f"transition {t.rollout_id}/{t.turn_index} lacks token ids; route the agent's calls through the "
                "LLM proxy (it asks vLLM for return_token_ids)"
            )
    width_p = prompt_length or max(len(t.prompt_token_ids) for t in transitions)
    width_r = response_length or max(len(t.response_token_ids) for t in transitions)
    too_long = [t for t in transitions if len(t.prompt_token_ids) > width_p]
    if too_long:
        t = too_long[0]
        raise ValueError(
            f"{len(too_long)} prompt(s) exceed prompt_length {width_p} (first: rollout {t.rollout_id}, call "
            f"{t.turn_index}, {len(t.prompt_token_ids)} tokens); raise max_prompt_tokens or drop them before"
        )
    scales = token_advantage_scales(transitions, loss_aggregation)
    rows = len(transitions)
    total_rows = -(-rows // size_multiple) * size_multiple
    prompts = torch.full((total_rows, width_p), pad_token_id, dtype=torch.long)
    responses = torch.full((total_rows, width_r), pad_token_id, dtype=torch.long)
    attention = torch.zeros((total_rows, width_p + width_r), dtype=torch.long)
    response_mask = torch.zeros((total_rows, width_r), dtype=torch.long)
    scores = torch.zeros((total_rows, width_r), dtype=torch.float32)
    advantage = torch.zeros((total_rows, width_r), dtype=torch.float32)
    with_logprobs = all(
        t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_token_ids) for t in transitions
    )
    logprobs = torch.zeros((total_rows, width_r), dtype=torch.float32) if with_logprobs else None
    truncated = 0
    for row in range(total_rows):
        t = transitions[row if row < rows else 0]
        prompt = t.prompt_token_ids
        response = t.response_token_ids[:width_r]
        truncated += row < rows and len(t.response_token_ids) > width_r
        n_p, n_r = len(prompt), len(response)
        prompts[row, width_p - n_p :] = torch.tensor(prompt, dtype=torch.long)
        responses[row, :n_r] = torch.tensor(response, dtype=torch.long)
        attention[row, width_p - n_p : width_p + n_r] = 1
        if row >= rows:
            continue  # filler: attends like a real row, trains on nothing
        mask = t.response_mask[:width_r] if t.response_mask is not None else [1] * n_r
        response_mask[row, :n_r] = torch.tensor(mask, dtype=torch.long)
        scores[row, n_r - 1] = t.reward
        if t.response_advantages is not None:  # a merged trajectory: each call's tokens carry its own advantage
            per_token = torch.tensor(t.response_advantages[:width_r], dtype=torch.float32)
            advantage[row, : len(per_token)] = per_token * scales[row]
        else:
            advantage[row, :] = float(t.advantage or 0.0) * scales[row]
        if logprobs is not None and t.response_logprobs is not None:
            logprobs[row, :n_r] = torch.tensor(t.response_logprobs[:width_r], dtype=torch.float32)
    advantages = advantage * response_mask.to(torch.float32)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "advantages": advantages,
        "returns": advantages.clone(),
    }
    if logprobs is not None:
        tensors["rollout_log_probs"] = logprobs
    pad_count = total_rows - rows
    return BatchTensors(
        tensors=tensors,
        uids=[t.group_id for t in transitions] + [PAD_UID] * pad_count,
        rollout_ids=[t.rollout_id for t in transitions] + [PAD_UID] * pad_count,
        real_rows=rows,
        truncated_responses=truncated,
    )


def transitions_to_batch(
    transitions: Sequence[Transition],
    *,
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    loss_aggregation: LossAggregation | str = LossAggregation.TOKEN_MEAN,
    size_multiple: int = 1,
    temperature: float = 1.0,
) -> DataProto:
    """verl's ``DataProto`` of ``transitions`` (see :func:`build_batch_tensors`); ``uid`` per task for grouping.

    ``meta_info`` carries the sampling ``temperature`` (verl divides logits by it when recomputing log-probs) and
    ``global_token_num`` (tokens per row, for verl's throughput metrics and token balancing).
    """
    from verl import DataProto

    built = build_batch_tensors(
        transitions,
        pad_token_id=pad_token_id,
        prompt_length=prompt_length,
        response_length=response_length,
        loss_aggregation=loss_aggregation,
        size_multiple=size_multiple,
    )
    non_tensors = {
        "uid": np.array(built.uids, dtype=object),
        "rollout_id": np.array(built.rollout_ids, dtype=object),
    }
    meta = {
        "temperature": temperature,
        "global_token_num": built.tensors["attention_mask"].sum(dim=-1).tolist(),
        "agentlightning_real_rows": built.real_rows,
        "agentlightning_truncated_responses": built.truncated_responses,
    }
    return DataProto.from_dict(tensors=built.tensors, non_tensors=non_tensors, meta_info=meta)
