"""Optimiser outputs that are not usable prompts are rejected with the reason logged and never installed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentlightning.store import InMemoryLightningStore
from agentlightning.testing.fake_openai import FakeError, FakeOpenAI, FakeOpenAIServer, FakeReply, FakeRequest
from agentlightning.trainer import Trainer
from agentlightning.types import LLM, PromptTemplate
from agentlightning_trainer.apo import APO, APOConfig, CandidateRejected, validate_candidate
from tests.trainer.apo._word_task import SEEDS, tasks, user_prompt_agent

BAD_EDITS = [
    "",  # empty
    "<prompt>   </prompt>",  # empty inside the tags
    "<prompt>Shout the word!</prompt>",  # lost {word}
    "<prompt>The word is {word} in {language}.</prompt>",  # a placeholder the agent does not fill
    "<prompt>The word is {word.</prompt>",  # does not parse as an f-string
    "<prompt>The word is {word}.</prompt>",  # unchanged
]


@pytest.fixture
def bad_optimizer() -> Iterator[FakeOpenAIServer]:
    """An optimiser whose edits are, in turn, every kind of unusable answer, then an upstream error."""
    edits = iter(BAD_EDITS)

    def reply(request: FakeRequest) -> FakeReply | FakeError:
        if "Write a short critique" in request.last_user_text:
            return FakeReply(text="Make it better.")
        edit = next(edits, None)
        return FakeError(500, "optimiser down") if edit is None else FakeReply(text=edit)

    with FakeOpenAI(reply=reply).serve() as server:
        yield server


@pytest.mark.timeout(120)
def test_unusable_edits_are_rejected_logged_and_never_installed(
    agent_upstream: FakeOpenAIServer, bad_optimizer: FakeOpenAIServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = InMemoryLightningStore()
    config = APOConfig(
        optimizer_base_url=bad_optimizer.base_url,
        optimizer_model="optimizer",
        agent_llm=LLM(base_url=agent_upstream.base_url, model="agent-model"),
        seed_templates={"user_prompt": SEEDS["user_prompt"]},
        rounds=7,
        beam_width=1,
        branch_factor=1,
        train_batch_size=2,
        run_dir=tmp_path,
    )
    # The optimiser client retries a 500 twice by default; its own retries are not what this test is about.
    caplog.set_level(logging.WARNING, logger="agentlightning_trainer.apo")
    apo = APO(config, show_progress=False)
    Trainer(apo, store=store, n_runners=4).fit(user_prompt_agent, tasks(), tasks()[:4])

    reasons = [r.getMessage() for r in caplog.records if "APO rejected candidate" in r.getMessage()]
    assert len(reasons) == 7
    expected = [
        "answer is empty",
        "answer is empty",
        "misses placeholders the agent fills: {word}",
        "adds placeholders the agent does not fill: ['language']",
        "does not parse as f-string",
        "unchanged from its parent",
        "optimiser call failed",
    ]
    for reason, fragment in zip(reasons, expected, strict=True):
        assert fragment in reason, (fragment, reason)
    # Nothing but the seed was ever installed as a resource.
    snapshots = asyncio.run(store.list_resources())
    assert snapshots and all(s.resources["user_prompt"] == SEEDS["user_prompt"] for s in snapshots)
    assert apo.best is not None and apo.best.candidate_id == "c0"
    assert all(c.templates == {} for c in apo.history if c.status == "rejected")


@pytest.mark.parametrize(
    ("text", "engine", "fragment"),
    [
        ("", "f-string", "empty"),
        ("<prompt>\n\n</prompt>", "jinja2", "empty"),
        ("Say hi", "f-string", "misses placeholders the agent fills: {word}"),
        ("Say {{ greeting }}", "jinja2", "misses placeholders the agent fills: {{ word }}"),
        ("{word} {}", "f-string", "does not render"),
        ("{{ word }} {% if %}", "jinja2", "does not parse as jinja2"),
        ("{{ word }} and {{ other }}", "jinja2", "adds placeholders"),
        ("x" * 50 + "{word}", "f-string", "more than max_template_chars"),
    ],
)
def test_validate_candidate_rejects(text: str, engine: str, fragment: str) -> None:
    seed = PromptTemplate(template="{word}" if engine == "f-string" else "{{ word }}", engine=engine)  # type: ignore[arg-type]  # parametrised literal
    with pytest.raises(CandidateRejected) as info:
        validate_candidate("t", text, seed=seed, current=seed, max_chars=40)
    assert fragment in str(info.value)


def test_validate_candidate_accepts_and_strips_the_tags() -> None:
    seed = PromptTemplate(template="Word: {word}")
    got = validate_candidate(
        "t", "Sure!\n<prompt>\nWord: {word}. Shout it.\n</prompt>", seed=seed, current=seed, max_chars=100
    )
    assert got == PromptTemplate(template="Word: {word}. Shout it.")
    # Without tags the whole answer is the template.
    assert validate_candidate("t", " Say {word}! ", seed=seed, current=seed, max_chars=100).template == "Say {word}!"


def test_optimizer_prompt_files_are_overridable_and_checked_up_front(
    agent_upstream: FakeOpenAIServer, optimizer_upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    from importlib import resources

    shipped = resources.files("agentlightning_trainer.apo").joinpath("prompts", "critique.jinja2").read_text()
    custom = tmp_path / "critique.jinja2"
    custom.write_text("HOUSE STYLE CRITIQUE.\n" + shipped)
    config = APOConfig(
        optimizer_base_url=optimizer_upstream.base_url,
        optimizer_model="optimizer",
        agent_llm=LLM(base_url=agent_upstream.base_url, model="agent-model"),
        seed_templates={"user_prompt": SEEDS["user_prompt"]},
        critique_template=custom,
        rounds=1,
        beam_width=1,
        branch_factor=1,
        train_batch_size=2,
        run_dir=tmp_path / "run",
    )
    apo = APO(config, show_progress=False)
    Trainer(apo, store=InMemoryLightningStore(), n_runners=2).fit(user_prompt_agent, tasks(), tasks()[:2])
    sent = [str(body["messages"][0]["content"]) for body in optimizer_upstream.fake.requests]
    assert any(text.startswith("HOUSE STYLE CRITIQUE.") for text in sent)
    assert apo.best is not None and apo.best.val_reward == 1.0

    broken = tmp_path / "edit.jinja2"
    broken.write_text("Edit {{ template_nmae }} please.")
    with pytest.raises(ValueError, match="template_nmae"):
        APO(config.model_copy(update={"edit_template": broken}), show_progress=False)
    with pytest.raises(ValueError, match="does not exist"):
        APOConfig.model_validate({**config.model_dump(), "edit_template": tmp_path / "missing.jinja2"})
