"""A CrewAI support desk, as its author wrote it: it knows nothing of Agent Lightning.

Three agents work one ticket in sequence: the **planner** restates the request and plans, the **specialist** routes
it to one team (billing, shipping, technical or returns) and may consult the team directory (its tool), the
**critic** checks the routing. The models sit behind any OpenAI-compatible Chat Completions endpoint with tool calling,
reached through CrewAI's own ``LLM`` class: the specialist's tool goes to the model as a native tool definition and
comes back as an OpenAI ``tool_calls`` entry, which CrewAI runs.
"""

from __future__ import annotations

import re
from typing import Final

from crewai import LLM, Agent, Crew, Process, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool

TEAMS: Final = {
    "billing": "charges , refunds of payments , invoices",
    "shipping": "parcels , delivery , tracking",
    "technical": "the app , crashes , passwords , login",
    "returns": "sending goods back , exchanges",
}


class TeamDirectoryTool(BaseTool):
    """The specialist's tool: which team handles what."""

    name: str = "team_directory"
    description: str = "List the support teams and the topics each one handles."

    def _run(self) -> str:
        return " ; ".join(f"{team} : {topics}" for team, topics in TEAMS.items())


def openai_model(model: str, base_url: str, *, temperature: float, max_tokens: int) -> LLM:
    """CrewAI's own model class on an OpenAI-compatible Chat Completions endpoint (native tool calls)."""
    return LLM(
        model=f"openai/{model}", base_url=base_url, api_key="unused", temperature=temperature, max_tokens=max_tokens,
        max_retries=0, timeout=120.0,
    )  # fmt: skip


def close_model(model: BaseLLM) -> None:
    """Close a model's HTTP connection pool (CrewAI's ``LLM`` has no ``close()``; one left to the garbage collector
    warns with a ResourceWarning wherever it happens to be collected)."""
    client = getattr(model, "_client", None)
    if client is not None:
        client.close()


def build_crew(planner_llm: BaseLLM, specialist_llm: BaseLLM, critic_llm: BaseLLM) -> Crew:
    """The planner → specialist (with the team directory) → critic crew; inputs: ``request``."""
    planner = Agent(
        role="planner", goal="Plan how the desk answers a ticket .", backstory="A calm dispatcher .",
        llm=planner_llm, max_iter=1,
    )  # fmt: skip
    specialist = Agent(
        role="specialist", goal="Route each ticket to the right team .", backstory="Knows every team .",
        tools=[TeamDirectoryTool()], llm=specialist_llm, max_iter=2,
    )  # fmt: skip
    critic = Agent(role="critic", goal="Check the routing .", backstory="Hard to please .", llm=critic_llm, max_iter=1)
    tasks = [
        Task(description="Plan the ticket : {request}", expected_output="a plan", agent=planner),
        Task(
            description="Route the ticket to billing , shipping , technical or returns : {request}",
            expected_output="one team",
            agent=specialist,
        ),
        Task(description="Check the routing of : {request}", expected_output="a verdict", agent=critic),
    ]
    return Crew(agents=[planner, specialist, critic], tasks=tasks, process=Process.sequential, verbose=False)


def routed_team(text: str) -> str | None:
    """The first team a reply names (what the desk files the ticket under), or None."""
    found = [(m.start(), team) for team in TEAMS for m in [re.search(team, text.lower())] if m]
    return min(found)[1] if found else None


def handle_ticket(request: str, planner_llm: BaseLLM, specialist_llm: BaseLLM, critic_llm: BaseLLM) -> str | None:
    """Run the crew on one ticket; returns the team the specialist routed it to."""
    result = build_crew(planner_llm, specialist_llm, critic_llm).kickoff(inputs={"request": request})
    return routed_team(result.tasks_output[1].raw)
