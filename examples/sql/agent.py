"""The SQL agent: a plain LangGraph program with three agents — write a query, check it, rewrite it.

It knows nothing of Agent Lightning: it calls any OpenAI-compatible model through ``ChatOpenAI(base_url=...)`` and
runs its queries on a SQLite database with a LangChain tool. ``train.py`` trains it without changing this file.

Two answer formats, one graph:

* ``"sql"`` — the model writes SQLite SQL, seeing the schema (what a real model does);
* ``"sketch"`` — the model answers in a compact query language that this agent compiles to SQL: an aggregate
  (``count``, ``sum``, ``avg``, ``max``, ``min``, or the words ``number``, ``total``, ``average``, ``highest``,
  ``lowest``), a column (``salary``, ``age``, ``budget``, ``cost``, ``hours``) or a table, and optionally a
  department name, e.g. ``avg salary research``. Constrained output formats like this are how an agent gets
  usable answers out of a very small model.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NotRequired, TypedDict

import certifi
import openai
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

QueryFormat = Literal["sql", "sketch"]
QUERY_FORMATS: Final[tuple[QueryFormat, ...]] = ("sql", "sketch")

SCHEMA: Final = """\
departments(id, name, city, budget)
employees(id, name, age, salary, department_id -> departments.id)
projects(id, name, cost, hours, department_id -> departments.id)"""

# Prompts per format. The sketch prompts are short on purpose: every word is a token of a tiny model's context.
PROMPTS: Final[dict[QueryFormat, dict[str, str]]] = {
    "sql": {
        "writer": f"You write SQLite queries. Tables:\n{SCHEMA}\nAnswer with one SQL query and nothing else.",
        "checker": (
            "You check SQLite queries. Given a question, a query and its result, reply CORRECT if the query "
            "answers the question, otherwise WRONG and the reason."
        ),
        "rewriter": (
            f"You fix SQLite queries. Tables:\n{SCHEMA}\nGiven a question, a query, its result and a review, "
            "answer with one corrected SQL query and nothing else."
        ),
    },
    "sketch": {
        "writer": "Write the query sketch for the question.",
        "checker": "Is the query right for the question? Reply correct or wrong.",
        "rewriter": "The query may be wrong. Write the query sketch for the question.",
    },
}

AGENT_NAMES: Final = ("writer", "checker", "rewriter")

# One TLS context for every HTTP client: building one per client loads the CA bundle each time (~20-60 ms of CPU),
# which would dominate the cost of a question when every question talks to a new base URL.
_TLS: Final = ssl.create_default_context(cafile=certifi.where())

_AGGREGATE_WORDS: Final = {
    "count": "COUNT", "number": "COUNT", "sum": "SUM", "total": "SUM", "avg": "AVG", "average": "AVG",
    "max": "MAX", "highest": "MAX", "min": "MIN", "lowest": "MIN",
}  # fmt: skip
_COLUMN_TABLES: Final = {
    "salary": "employees", "age": "employees", "budget": "departments", "cost": "projects", "hours": "projects",
}  # fmt: skip
_TABLE_WORDS: Final = {
    "employees": "employees", "employee": "employees", "departments": "departments", "department": "departments",
    "projects": "projects", "project": "projects",
}  # fmt: skip
_DEPARTMENT_WORDS: Final = ("sales", "research", "finance", "support", "marketing", "legal")
# Longest first, so that "average" is read as an aggregate before the "age" inside it is read as a column.
_KEYWORDS: Final = sorted(
    [*_AGGREGATE_WORDS, *_COLUMN_TABLES, *_TABLE_WORDS, *_DEPARTMENT_WORDS], key=len, reverse=True
)
_KEYWORD_RE: Final = re.compile("|".join(_KEYWORDS))


class SqlState(TypedDict):
    """What flows through the graph (the input has only the question; the writer sets the rest)."""

    question: str
    query: str  # the model's latest answer (SQL or sketch), as written
    sql: str  # the SQL that ran
    result: str
    review: NotRequired[str]
    rewrites: int


def compile_sketch(text: str) -> str | None:
    """SQL for a query sketch (keywords in any order; the first of each kind counts), or None if it names none."""
    aggregate = column = table = department = None
    for match in _KEYWORD_RE.finditer(text.lower()):
        word = match.group()
        if word in _AGGREGATE_WORDS:
            aggregate = aggregate or _AGGREGATE_WORDS[word]
        elif word in _COLUMN_TABLES:
            column = column or word
        elif word in _TABLE_WORDS:
            table = table or _TABLE_WORDS[word]
        else:
            department = department or word
    if aggregate is None or (column is None and table is None):
        return None
    if column is not None:
        table, target = _COLUMN_TABLES[column], column
    elif aggregate == "COUNT":
        target = "*"
    else:
        return None  # an aggregate other than count needs a column
    assert table is not None  # set from the column or found in the text
    if department is None:
        return f"SELECT {aggregate}({target}) FROM {table}"
    if table == "departments":
        return f"SELECT {aggregate}({target}) FROM departments WHERE name = '{department}'"
    alias = table[0]
    target = target if target == "*" else f"{alias}.{target}"
    return (
        f"SELECT {aggregate}({target}) FROM {table} {alias} JOIN departments d ON {alias}.department_id = d.id "
        f"WHERE d.name = '{department}'"
    )


def extract_sql(text: str) -> str:
    """The SQL in a model's answer: a fenced block's body, else the text from its first SELECT/WITH on."""
    fenced = re.search(r"```(?:sql)?\s*(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if fenced:
        return fenced.group(1).strip()
    start = re.search(r"\b(SELECT|WITH)\b", text, re.IGNORECASE)
    return (text[start.start() :] if start else text).strip().rstrip(";")


def make_query_tool(db_path: Path, *, max_rows: int = 3) -> BaseTool:
    """The ``run_query`` tool: runs one query read-only on the database and returns its first rows as text."""

    @tool
    def run_query(query: str) -> str:
        """Run a SQLite query and return its rows (or the error)."""
        try:
            with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
                rows = db.execute(query).fetchmany(max_rows + 1)
        except (sqlite3.Error, ValueError) as exc:  # ValueError: e.g. a NUL byte in the text
            return f"error: {exc}"[:80]
        shown = ["(" + ", ".join(_short(v) for v in row) + ")" for row in rows[:max_rows]]
        return " ".join(shown) + (" ..." if len(rows) > max_rows else "") if rows else "no rows"

    return run_query


def _short(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def is_approved(review: str) -> bool:
    """True unless the checker's review rejects the query (says wrong, incorrect or not correct)."""
    text = review.lower()
    return not any(word in text for word in ("wrong", "incorrect", "not correct"))


def failed(result: str) -> bool:
    """True when the query did not run (its result is the database's error)."""
    return result.startswith("error:")


@dataclass(frozen=True)
class SqlContext:
    """Run-scoped context of one question: the chat model of each agent of the graph (one model may serve all)."""

    model: BaseChatModel
    """The model of every agent not in ``agent_models``."""
    agent_models: Mapping[str, BaseChatModel] = field(default_factory=dict[str, BaseChatModel])

    def model_for(self, agent: str) -> BaseChatModel:
        """The model ``agent`` calls."""
        return self.agent_models.get(agent, self.model)


@functools.lru_cache(maxsize=16)
def build_sql_agent(db_path: Path, *, query_format: QueryFormat = "sql", max_rewrites: int = 1) -> Any:
    """The compiled graph: write, then review or fix until the checker approves or the rewrites run out.

    Node names are the agent names (``writer``, ``checker``, ``rewriter``). A query that runs goes to the checker,
    whose review either approves it (the answer) or sends it to the rewriter; a query that fails to run goes to the
    rewriter directly, with the error. After the last allowed rewrite the graph ends: nothing would act on another
    review. The model comes with each run (``context=SqlContext(model)``), so one compiled graph serves every
    question.
    """
    if query_format not in QUERY_FORMATS:
        raise ValueError(f"query_format must be one of {QUERY_FORMATS}; got {query_format!r}")
    if max_rewrites < 1:
        raise ValueError(
            f"max_rewrites must be at least 1 (the rewriter is one of the three agents); got {max_rewrites}"
        )
    prompts = PROMPTS[query_format]
    run_query = make_query_tool(db_path)

    def to_sql(answer: str) -> str:
        if query_format == "sketch":
            return compile_sketch(answer) or answer.strip()  # an unreadable sketch runs as is and fails visibly
        return extract_sql(answer)

    async def execute(answer: str) -> dict[str, str]:
        sql = to_sql(answer)
        return {"query": answer.strip(), "sql": sql, "result": str(await run_query.ainvoke({"query": sql}))}

    async def writer(state: SqlState, runtime: Runtime[SqlContext]) -> dict[str, Any]:
        messages = [SystemMessage(prompts["writer"]), HumanMessage(state["question"])]
        reply = await runtime.context.model_for("writer").ainvoke(messages)
        return {**await execute(reply.text), "rewrites": 0}

    async def checker(state: SqlState, runtime: Runtime[SqlContext]) -> dict[str, Any]:
        shown = f"question: {state['question']}\nquery: {state['query']}\nresult: {state['result']}"
        reply = await runtime.context.model_for("checker").ainvoke(
            [SystemMessage(prompts["checker"]), HumanMessage(shown)]
        )
        return {"review": reply.text.strip()}

    async def rewriter(state: SqlState, runtime: Runtime[SqlContext]) -> dict[str, Any]:
        shown = f"question: {state['question']}\nquery: {state['query']}\nresult: {state['result']}"
        if not failed(state["result"]):  # a query that failed has the error instead of a review
            shown += f"\nreview: {state.get('review', '')}"
        reply = await runtime.context.model_for("rewriter").ainvoke(
            [SystemMessage(prompts["rewriter"]), HumanMessage(shown)]
        )
        return {**await execute(reply.text), "rewrites": state.get("rewrites", 0) + 1}

    def review_or_fix(state: SqlState) -> str:
        if state.get("rewrites", 0) >= max_rewrites:
            return END  # the last rewrite is the answer: nothing would act on another review
        # A query that does not run needs no review: the error says what to fix.
        return "rewriter" if failed(state["result"]) else "checker"

    def after_check(state: SqlState) -> str:
        return END if is_approved(state.get("review", "")) else "rewriter"

    graph = StateGraph(SqlState, context_schema=SqlContext)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_conditional_edges("writer", review_or_fix, ["checker", "rewriter"])
    graph.add_conditional_edges("checker", after_check, ["rewriter", END])
    graph.add_conditional_edges("rewriter", review_or_fix, ["checker", "rewriter", END])
    return graph.compile(name="sql-agent")


async def answer_question(
    question: str,
    db_path: Path,
    *,
    base_url: str,
    model: str,
    agent_models: Mapping[str, str] | None = None,
    api_key: str = "unused",
    query_format: QueryFormat = "sql",
    max_rewrites: int = 1,
    temperature: float = 0.0,
    max_tokens: int = 256,
) -> SqlState:
    """Answer ``question`` on the database with the model at ``base_url``; returns the final state (``sql``...).

    ``agent_models`` names another model of the same server for some agents (``{"writer": "sql-writer"}``); the
    others call ``model``.
    """
    graph = build_sql_agent(db_path, query_format=query_format, max_rewrites=max_rewrites)
    # Own HTTP clients, closed when the question is answered: ChatOpenAI would otherwise build (and cache, per
    # base URL) two fresh ones for every new base URL.
    async with openai.DefaultAsyncHttpxClient(verify=_TLS) as http_async:
        with openai.DefaultHttpxClient(verify=_TLS) as http_sync:

            def chat(name: str) -> ChatOpenAI:
                return ChatOpenAI(
                    model=name,
                    base_url=base_url,
                    api_key=api_key,  # pyright: ignore[reportArgumentType]  # langchain-openai types it as SecretStr
                    temperature=temperature,
                    max_tokens=max_tokens,  # pyright: ignore[reportCallIssue]  # populated by alias
                    max_retries=0,
                    http_async_client=http_async,
                    http_client=http_sync,
                )

            models = {agent: chat(name) for agent, name in (agent_models or {}).items() if name != model}
            return await graph.ainvoke({"question": question}, context=SqlContext(chat(model), models))
