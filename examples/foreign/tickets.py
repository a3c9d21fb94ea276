"""Customer tickets and the team that takes each: the example's training and validation tasks."""

from __future__ import annotations

from typing import Any

# Each team has its cue words; a ticket names one of them in a sentence of its own. Validation tickets use the
# same cues in other sentences, so what transfers is the cue, not the sentence.
TRAIN: tuple[tuple[str, str], ...] = (
    ("I was charged twice for my order.", "billing"),
    ("Please send me the invoice for last month.", "billing"),
    ("My package has not arrived yet.", "shipping"),
    ("Where is my delivery? It is late.", "shipping"),
    ("I want a refund for the broken lamp.", "returns"),
    ("How do I return these shoes?", "returns"),
    ("I forgot my password and cannot log in.", "account"),
    ("Please change the email on my login.", "account"),
)
VAL: tuple[tuple[str, str], ...] = (
    ("Why was I charged two times this week?", "billing"),
    ("The delivery went to the wrong address.", "shipping"),
    ("Can I get a refund on this order?", "returns"),
    ("My password reset link does not work.", "account"),
)


def as_tasks(pairs: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """Tasks as the rollout function takes them: ``{"ticket": ..., "team": ...}``."""
    return [{"ticket": ticket, "team": team} for ticket, team in pairs]
