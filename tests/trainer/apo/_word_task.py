"""A task where the prompt decides success, its agents, and a scripted optimiser LLM whose edits follow rules."""

from __future__ import annotations

import re
from typing import Any

from openai import OpenAI

from agentlightning.agent import rollout
from agentlightning.testing.fake_openai import FakeReply, FakeRequest
from agentlightning.types import LLM, PromptTemplate

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "flame")
# The instruction the scripted optimiser appends to each template; each one is worth half the reward.
FIXES = {
    "system_prompt": "Always answer in UPPERCASE.",
    "user_prompt": "Add an exclamation mark.",
    "writer_prompt": "Add an exclamation mark.",
}
SEEDS = {
    "system_prompt": PromptTemplate(template="Repeat the word you are given."),
    "user_prompt": PromptTemplate(template="The word is {word}."),
}


def agent_model(request: FakeRequest) -> FakeReply:
    """The agent's model: repeats the word, in capitals / with '!' only when the prompts say so."""
    system = " ".join(str(m.get("content")) for m in request.messages if m.get("role") == "system")
    user = request.last_user_text
    found = re.search(r"word is (\w+)", user)
    word = found.group(1) if found else "?"
    if "UPPERCASE" in system:
        word = word.upper()
    if "exclamation" in user:
        word += "!"
    return FakeReply(text=word)


def scripted_optimizer(request: FakeRequest) -> FakeReply:
    """Critiques vaguely, then appends the template's known fix (returns it unchanged once the fix is there)."""
    text = request.last_user_text
    if "Write a short critique" in text:
        return FakeReply(text="The replies miss what the reward wants; state it in the template.")
    name = re.search(r"editing the prompt template `(\w+)`", text)
    current = re.search(r"<template>\n(.*?)\n</template>", text, re.DOTALL)
    assert name and current, f"unexpected optimiser request: {text[:300]}"
    template, fix = current.group(1), FIXES[name.group(1)]
    edited = template if fix in template else f"{template} {fix}"
    return FakeReply(text=f"Here it is.\n<prompt>{edited}</prompt>")


@rollout
def word_agent(task: dict[str, Any], llm: LLM, system_prompt: PromptTemplate, user_prompt: PromptTemplate) -> float:
    """Asks the model to repeat a word; half a point for capitals, half for a final '!'."""
    with OpenAI(base_url=llm.base_url, api_key="x", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "system", "content": system_prompt.format()},
                {"role": "user", "content": user_prompt.format(word=task["word"])},
            ],
        )
    text = reply.choices[0].message.content or ""
    return 0.5 * text.startswith(task["word"].upper()) + 0.5 * text.endswith("!")


@rollout
def user_prompt_agent(task: dict[str, Any], llm: LLM, user_prompt: PromptTemplate) -> float:
    """The same task with one template: only the '!' half can be earned."""
    with OpenAI(base_url=llm.base_url, api_key="x", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": user_prompt.format(word=task["word"])}]
        )
    return 1.0 if (reply.choices[0].message.content or "").endswith("!") else 0.0


def tasks(words: tuple[str, ...] = WORDS) -> list[dict[str, str]]:
    """One task per word."""
    return [{"word": w} for w in words]


def _invoke(name: str) -> Any:
    """An ``invoke_agent`` span around an agent's calls (the adapter matches the proxy's spans to it by time)."""
    from agentlightning import semconv as sc
    from agentlightning.emit import operation

    return operation(name, attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: name})


@rollout
def two_agent_system(
    task: dict[str, Any], llm: LLM, planner_prompt: PromptTemplate, writer_prompt: PromptTemplate
) -> float:
    """A planner then a writer; only the writer's template decides the reward (the '!' rule)."""
    with OpenAI(base_url=llm.base_url, api_key="x", max_retries=0, timeout=30) as client:
        with _invoke("planner"):
            client.chat.completions.create(
                model=llm.model,
                messages=[
                    {"role": "system", "content": planner_prompt.format()},
                    {"role": "user", "content": f"planner-input {task['word']}"},
                ],
            )
        with _invoke("writer"):
            reply = client.chat.completions.create(
                model=llm.model,
                messages=[
                    {"role": "system", "content": "writer-input"},
                    {"role": "user", "content": writer_prompt.format(word=task["word"])},
                ],
            )
    return 1.0 if (reply.choices[0].message.content or "").endswith("!") else 0.0
