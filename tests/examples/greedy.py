"""Greedy replies of each served model on the same prompt before and after training, read from validation spans.

Validation runs greedily, so an agent served by the untouched base must answer the prompts it saw at step 0 with the
same tokens after training (its behaviour cannot change), while a trained agent's own weights should answer some
differently. The proxy's spans hold the step-0 side: prompt and response token ids, the policy version and the model
name that answered (``<base>`` or ``<base>@<agent>``); the trained policy answers them again.
"""

from __future__ import annotations

from typing import Any

from agentlightning import semconv as sc
from agentlightning.store.base import LightningStore

Replies = dict[str, dict[tuple[int, ...], dict[int, tuple[int, ...]]]]
"""model name -> prompt token ids -> policy version -> greedy response token ids."""


async def greedy_replies(store: LightningStore) -> Replies:
    """Every validation call's greedy reply, by the model that answered it, its prompt and its policy version."""
    replies: Replies = {}
    for rollout in await store.query_rollouts(mode="val"):
        for span in await store.query_spans(rollout.rollout_id, "latest"):
            attrs = span.attributes
            prompt, response = attrs.get(sc.PROMPT_TOKEN_IDS), attrs.get(sc.RESPONSE_TOKEN_IDS)
            version, model = attrs.get(sc.POLICY_VERSION), attrs.get(sc.GEN_AI_RESPONSE_MODEL)
            if not isinstance(prompt, list | tuple) or not isinstance(response, list | tuple) or version is None:
                continue
            by_version = replies.setdefault(str(model), {}).setdefault(tuple(int(i) for i in prompt), {})
            by_version[int(str(version))] = tuple(int(i) for i in response)
    return replies


def replies_now(policy: Any, replies: Replies, model: str, adapter: str | None) -> tuple[int, int]:
    """Replay the prompts ``model`` answered in the first validation on ``policy`` (the trained one) serving
    ``adapter`` (None: the frozen base), greedily; (prompts replayed, how many replies differ from the recorded)."""
    versions = {v for by_version in replies.get(model, {}).values() for v in by_version}
    if not versions:
        return 0, 0
    first = min(versions)
    asked = [(prompt, by_version[first]) for prompt, by_version in replies[model].items() if first in by_version]
    if not asked:
        return 0, 0
    now = policy.generate(
        [list(p) for p, _ in asked], temperatures=[0.0] * len(asked), max_new_tokens=[len(r) for _, r in asked],
        adapters=[adapter] * len(asked),
    )  # fmt: skip
    return len(asked), sum(1 for (_, before), after in zip(asked, now, strict=True) if tuple(after.token_ids) != before)
