"""The optimiser side of APO: its own prompts (editable jinja2 files), the LLM calls, and candidate validation."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agentlightning.types import PromptTemplate
from agentlightning_trainer.batches import RolloutOutcome

_PROMPT_TAG = re.compile(r"<prompt>(.*?)(?:</prompt>|\Z)", re.DOTALL)
_DUMMY = "x"


class CandidateRejected(ValueError):
    """An optimiser output that must not be installed as a resource; the message says why."""


def load_optimizer_prompt(name: str, override: Path | None = None) -> str:
    """Text of the optimiser prompt ``name`` (``critique`` or ``edit``): the override file, else the shipped one."""
    if override is not None:
        return override.read_text(encoding="utf-8")
    return resources.files("agentlightning_trainer.apo").joinpath("prompts", f"{name}.jinja2").read_text("utf-8")


def placeholder_syntax(engine: str, name: str) -> str:
    """How a placeholder is written in a template of ``engine``."""
    return "{" + name + "}" if engine == "f-string" else "{{ " + name + " }}"


def render_optimizer_prompt(source: str, **values: Any) -> str:
    """Render an optimiser prompt; an unknown variable raises (a typo in an edited prompt file fails loudly)."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    try:
        return env.from_string(source).render(**values).strip() + "\n"
    except jinja2.TemplateError as exc:
        raise ValueError(
            f"optimiser prompt does not render: {exc}; it may use {sorted(values)} (see apo/prompts/)"
        ) from exc


def critique_request(
    source: str, name: str, templates: Mapping[str, PromptTemplate], outcomes: Sequence[RolloutOutcome],
    *, max_examples: int, max_example_chars: int,
) -> str:  # fmt: skip
    """The critique prompt for template ``name``, showing the worst runs of ``outcomes``."""
    rewards = [o.reward for o in outcomes if o.reward is not None]
    return render_optimizer_prompt(
        source,
        template_name=name,
        templates={k: v.template for k, v in templates.items()},
        mean_reward=sum(rewards) / max(1, len(outcomes)),
        examples=[describe_outcome(o, max_example_chars) for o in pick_examples(outcomes, max_examples)],
        reward_range=f"observed {min(rewards):.2f} to {max(rewards):.2f}" if rewards else "none observed",
    )


def edit_request(source: str, name: str, current: PromptTemplate, seed: PromptTemplate, critique: str) -> str:
    """The edit prompt for template ``name``: its current text, the placeholders to keep, the critique."""
    return render_optimizer_prompt(
        source,
        template_name=name,
        template=current.template,
        engine=current.engine,
        placeholders=sorted(seed.placeholders),
        placeholder_syntax=lambda p: placeholder_syntax(seed.engine, str(p)),  # pyright: ignore[reportUnknownLambdaType]  # called from jinja2
        critique=critique,
    )


def check_optimizer_prompts(critique_source: str, edit_source: str) -> None:
    """Render both optimiser prompts once with sample values, so an edited prompt file fails before any rollout."""
    sample = PromptTemplate(template="Answer {question}.")
    critique_request(critique_source, "t", {"t": sample}, [], max_examples=1, max_example_chars=100)
    edit_request(edit_source, "t", sample, sample, "a critique")


def describe_outcome(outcome: RolloutOutcome, max_chars: int) -> dict[str, Any]:
    """One rollout as the critique prompt shows it: task, reward, and each selected call's messages and reply."""
    calls: list[str] = []
    for t in outcome.transitions:
        lines = [f"[{m.get('role')}] {_content(m)}" for m in t.prompt_messages or []]
        lines += [f"[reply] {_content(m)}" for m in t.response_messages or []]
        agent = f" ({t.agent_name})" if t.agent_name else ""
        calls.append(f"call {t.turn_index}{agent}:\n" + "\n".join(lines))
    text = "\n".join(calls)
    if len(text) > max_chars:
        text = text[: max_chars - 20] + "\n... (cut)"
    task = json.dumps(outcome.task, ensure_ascii=False, default=str)
    failed = " (the run failed)" if outcome.rollout.status != "succeeded" else ""
    return {"task": task[:max_chars] + failed, "reward": outcome.reward or 0.0, "calls": [text] if text else []}


def pick_examples(outcomes: Sequence[RolloutOutcome], n: int) -> list[RolloutOutcome]:
    """The ``n`` worst rollouts (failures teach most), then the best one for contrast when there is room."""
    ranked = sorted(outcomes, key=lambda o: o.reward if o.reward is not None else float("-inf"))
    if len(ranked) <= n:
        return ranked
    return [*ranked[: n - 1], ranked[-1]]


def extract_prompt(text: str) -> str:
    """The template inside ``<prompt>…</prompt>`` (the edit prompt asks for it), else the whole answer."""
    match = _PROMPT_TAG.search(text)
    return (match.group(1) if match else text).strip()


def validate_candidate(
    name: str, text: str, *, seed: PromptTemplate, current: PromptTemplate, max_chars: int
) -> PromptTemplate:
    """The optimiser's edit of template ``name`` as a template the agent can use, or :class:`CandidateRejected`.

    ``seed`` decides the engine and the placeholders the agent fills: a candidate must keep them all and add none.
    """
    body = extract_prompt(text)
    if not body:
        raise CandidateRejected(f"template {name!r}: the optimiser's answer is empty")
    if len(body) > max_chars:
        raise CandidateRejected(f"template {name!r}: {len(body)} characters, more than max_template_chars {max_chars}")
    if " ".join(body.split()) == " ".join(current.template.split()):
        raise CandidateRejected(f"template {name!r}: unchanged from its parent")
    try:
        candidate = PromptTemplate(template=body, engine=seed.engine)
    except ValueError as exc:
        raise CandidateRejected(f"template {name!r}: {exc}") from exc
    missing = sorted(seed.placeholders - candidate.placeholders)
    if missing:
        need = ", ".join(placeholder_syntax(seed.engine, p) for p in missing)
        raise CandidateRejected(f"template {name!r}: misses placeholders the agent fills: {need}")
    extra = sorted(candidate.placeholders - seed.placeholders)
    if extra:
        raise CandidateRejected(
            f"template {name!r}: adds placeholders the agent does not fill: {extra} "
            f"(the agent fills {sorted(seed.placeholders)})"
        )
    try:
        candidate.format(**dict.fromkeys(candidate.placeholders, _DUMMY))
    except Exception as exc:  # both engines raise their own types (IndexError on '{}', jinja2 errors, ...)
        raise CandidateRejected(f"template {name!r}: does not render: {type(exc).__name__}: {exc}") from exc
    return candidate


@dataclass
class OptimizerLLM:
    """Calls the optimiser model through any OpenAI-compatible endpoint."""

    base_url: str
    model: str
    api_key: str
    temperature: float
    timeout_s: float

    def __post_init__(self) -> None:
        """Open the HTTP client to the optimiser endpoint."""
        from openai import AsyncOpenAI

        self._client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s)
        self.calls = 0

    async def complete(self, prompt: str) -> str:
        """The model's text answer to one user message."""
        self.calls += 1
        reply = await self._client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}], temperature=self.temperature
        )
        if not reply.choices:
            return ""
        return reply.choices[0].message.content or ""

    async def close(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = [str(p.get("text", "")) for p in content if isinstance(p, dict)]  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]  # JSON parts
        text = "".join(parts)
    else:
        text = ""
    calls = message.get("tool_calls")
    if calls:
        text += f" tool_calls={json.dumps(calls, default=str)}"
    return text
