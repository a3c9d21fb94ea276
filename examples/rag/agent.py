"""A multi-hop research agent on the OpenAI Agents SDK, as its author wrote it: it knows nothing of Agent Lightning.

The agent answers a composed question ("where was the director of Alpha born") by walking the corpus one hop at a
time. It starts at the entity the question names; each turn an Agents SDK ``Agent`` reads the question and the facts
found so far and replies ``search <relation or keywords>`` (look the current entity up) or ``answer [<text>]``.
Searches go to a local BM25 retriever (SQLite FTS5, standard library) restricted to passages about the current
entity, as a reader follows the links of the page it is on; the passage found names the next entity. ``answer``
with no text answers with the entity the walk has reached.

The model is reached through the Chat Completions API (``OpenAIChatCompletionsModel``) with plain-text replies, so
any OpenAI-compatible server works, including ones without tool calling; the retriever call is traced as a function
span with the SDK's own tracing API, so it appears in the run's trace like a function tool.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_span, trace
from openai import AsyncOpenAI

from examples.rag.corpus import RELATIONS, Passage

# Short on purpose: every prompt token dilutes a tiny policy's attention (the CPU mode), and real models need no more.
INSTRUCTIONS = "Reply search and one of " + " , ".join(RELATIONS) + " to look up the entity , or answer ."
_WORD = re.compile(r"[A-Za-z0-9]+")


class Retriever:
    """BM25 search over passages with SQLite FTS5, restricted to the passages about one entity (their title)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        """Index ``passages`` in an in-memory FTS5 table."""
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE passages USING fts5(title, text, answer UNINDEXED)")
        self._db.executemany(
            "INSERT INTO passages (title, text, answer) VALUES (?, ?, ?)",
            [(p.title, p.text, p.answer) for p in passages],
        )
        self._titles = {p.title.lower(): p.title for p in passages}
        self._by_text = {p.text: p for p in passages}

    def link(self, question: str) -> str | None:
        """The entity the question names (the first word that is a passage title), where the walk starts."""
        return next((self._titles[w.lower()] for w in _WORD.findall(question) if w.lower() in self._titles), None)

    def search(self, entity: str, query: str) -> Passage | None:
        """The best BM25 match for ``query`` among the passages titled ``entity``, or None."""
        words = _WORD.findall(query)
        if not words:
            return None
        match = " OR ".join(f'"{w}"' for w in words)
        # Column filter in the MATCH expression keeps ranking in FTS5; bm25() is lower-is-better.
        row = self._db.execute(
            "SELECT text FROM passages WHERE passages MATCH ? ORDER BY bm25(passages) LIMIT 1",
            (f'title:"{entity}" AND text:({match})',),
        ).fetchone()
        return None if row is None else self._by_text[row[0]]


@dataclass(frozen=True)
class Step:
    """One search the agent made: the entity it stood on, the query, and the passage found (None: nothing)."""

    entity: str
    query: str
    passage: Passage | None


@dataclass(frozen=True)
class Action:
    """What a reply asks for: ``search`` with a query, or ``answer`` with text (empty: the current entity)."""

    kind: str
    text: str


def parse_action(reply: str) -> Action:
    """Read a reply leniently: ``answer`` before any relation word answers, anything else is a search query."""
    text = reply.strip()
    lower = text.lower()
    answer_at = lower.find("answer")
    relation_at = min((i for i in (lower.find(r) for r in RELATIONS) if i >= 0), default=-1)
    if answer_at >= 0 and (relation_at < 0 or answer_at < relation_at):
        return Action("answer", text[answer_at + len("answer") :].strip(" :.,"))
    return Action("search", re.sub(r"(?i)\bsearch\b", " ", text).strip())


def prompt(question: str, entity: str | None, found: Sequence[str]) -> str:
    """The user message of one turn: the question, the current entity, and the facts found so far."""
    facts = " ".join(found) if found else "nothing"
    return f"question : {question}\nentity : {entity or 'unknown'}\nfound : {facts}"


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncOpenAI] = weakref.WeakKeyDictionary()


def _client(base_url: str, api_key: str) -> AsyncOpenAI:
    """One connection pool per event loop (an async client must not outlive its loop); per call only the URL varies."""
    loop = asyncio.get_running_loop()
    shared = _CLIENTS.get(loop)
    if shared is None:
        shared = _CLIENTS[loop] = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120.0)
    return shared.with_options(base_url=base_url, api_key=api_key)


async def answer_question(
    question: str,
    retriever: Retriever,
    *,
    base_url: str,
    model: str,
    api_key: str = "unused",
    temperature: float = 0.7,
    max_tokens: int = 32,
    max_turns: int = 4,
    on_step: Callable[[Step], None] | None = None,
) -> str:
    """Answer ``question`` by searching hop by hop; after ``max_turns`` replies, answer with the entity reached."""
    agent = Agent(
        name="researcher",
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model=model, openai_client=_client(base_url, api_key)),
        model_settings=ModelSettings(temperature=temperature, max_tokens=max_tokens),
    )
    entity = retriever.link(question)
    found: list[str] = []
    with trace("multi-hop qa"):
        for _ in range(max_turns):
            result = await Runner.run(agent, prompt(question, entity, found), max_turns=1)
            action = parse_action(str(result.final_output))
            if action.kind == "answer":
                return action.text or entity or ""
            with function_span("search", input=f"{entity}: {action.text}") as span:
                passage = None if entity is None else retriever.search(entity, action.text)
                span.span_data.output = passage.text if passage else "no result"
            if on_step is not None:
                on_step(Step(entity or "", action.text, passage))
            if passage is not None:
                found.append(passage.text)
                entity = passage.answer
    return entity or ""
