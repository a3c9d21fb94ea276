"""A CrewAI support desk, as its author wrote it: it knows nothing of Agent Lightning.

Three agents work one ticket in sequence: the **planner** restates the request and plans, the **specialist** routes
it to one team (billing, shipping, technical or returns) and may consult the team directory (its tool), the
**critic** checks the routing. The models sit behind any OpenAI-compatible Chat Completions endpoint, reached in
plain text (CrewAI's ReAct format for tools), so small self-hosted servers without tool calling work too.
"""

from __future__ import annotations

import re
import ssl
from typing import Any, Final

import certifi
from crewai import Agent, Crew, Process, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.tools import BaseTool
from openai import DefaultHttpxClient, OpenAI
from pydantic import Field, PrivateAttr

TEAMS: Final = {
    "billing": "charges , refunds of payments , invoices",
    "shipping": "parcels , delivery , tracking",
    "technical": "the app , crashes , passwords , login",
    "returns": "sending goods back , exchanges",
}


# One TLS context for every model client: building one per client loads the CA bundle each time (~20-60 ms of CPU),
# which would dominate a ticket's cost when each ticket's agents get new clients.
_TLS: Final = ssl.create_default_context(cafile=certifi.where())


class TeamDirectoryTool(BaseTool):
    """The specialist's tool: which team handles what."""

    name: str = "team_directory"
    description: str = "List the support teams and the topics each one handles."

    def _run(self) -> str:
        return " ; ".join(f"{team} : {topics}" for team, topics in TEAMS.items())


class OpenAITextLLM(BaseLLM):
    """A CrewAI model on an OpenAI-compatible Chat Completions endpoint, in plain text (no native tool calls).

    Like CrewAI's own models it emits the LLM call events, with the completion id as ``response_id``.
    """

    base_url: str | None = Field(default=None, description="The endpoint, e.g. http://localhost:8000/v1")
    api_key: str | None = Field(default="unused", description="The endpoint's key.")
    max_tokens: int = Field(default=256, description="Longest reply.")
    _client: OpenAI | None = PrivateAttr(default=None)

    def supports_function_calling(self) -> bool:
        """Tools go through CrewAI's ReAct text format."""
        return False

    def _openai(self) -> OpenAI:
        if self._client is None:
            self._client = OpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                max_retries=0,
                timeout=120.0,
                http_client=DefaultHttpxClient(verify=_TLS),
            )
        return self._client

    def close(self) -> None:
        """Close the HTTP connection pool."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str:
        """One chat completion; emits LLMCallStarted and LLMCallCompleted (or Failed) as CrewAI's models do."""
        conversation = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        with llm_call_context():
            self._emit_call_started_event(
                messages=messages, tools=tools, callbacks=callbacks, from_task=from_task, from_agent=from_agent
            )
            try:
                reply = self._openai().chat.completions.create(
                    model=self.model,
                    messages=conversation,
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    stop=self.stop or None,
                )
            except Exception as exc:
                self._emit_call_failed_event(error=str(exc), from_task=from_task, from_agent=from_agent)
                raise
            text = reply.choices[0].message.content or ""
            usage = reply.usage
            self._emit_call_completed_event(
                response=text,
                call_type=LLMCallType.LLM_CALL,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
                usage=None
                if usage is None
                else {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
                finish_reason=reply.choices[0].finish_reason,
                response_id=reply.id,
            )
            return text

    def get_input_tokens_count(self, messages: str | list[Any], tools: Any = None, response_model: Any = None) -> int:
        """CrewAI's own estimate (four characters a token): the endpoint has no token-count route, and the base
        class logs a warning on each of the crew's calls when it estimates."""
        del tools, response_model
        text = messages if isinstance(messages, str) else "".join(str(m.get("content") or "") for m in messages)
        return (len(text) + 3) // 4

    async def acall(self, *args: Any, **kwargs: Any) -> str:
        """The same, for CrewAI's async path."""
        return self.call(*args, **kwargs)


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
