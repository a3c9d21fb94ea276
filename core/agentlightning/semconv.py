"""The span attribute contract: OpenTelemetry GenAI names plus the ``agentlightning.*`` extension.

This module is a public contract. Every integration, the LLM proxy, the emit helpers and the adapter read and write
span attributes only through these names.

GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/) cover LLM calls, agents and tools.
Message-valued attributes (``gen_ai.input.messages``, ``gen_ai.output.messages``, ``gen_ai.system_instructions``,
``gen_ai.tool.definitions``) are JSON strings. Messages use the OpenAI chat shape
(``{"role": ..., "content": ..., "tool_calls": [...]}``), which is what every framework we integrate speaks.

Our extension (``agentlightning.*``) holds only what GenAI lacks:

=========================================  ==========  ============================================================
attribute                                  type        meaning
=========================================  ==========  ============================================================
``agentlightning.rollout_id``              str         rollout the span belongs to (also on the span resource)
``agentlightning.attempt_id``              str         attempt the span belongs to (also on the span resource)
``agentlightning.prompt_token_ids``        list[int]   token ids of the full prompt, as the engine tokenised it
``agentlightning.response_token_ids``      list[int]   token ids the engine generated (first choice)
``agentlightning.response_logprobs``       list[float] log-probabilities of ``response_token_ids`` under the policy
``agentlightning.policy_version``          int         weights version that produced the response
``agentlightning.reward.primary``          str         name of the primary reward dimension of a reward span
``agentlightning.reward.<name>``           float       value of reward dimension ``<name>`` (one per dimension);
                                                       a plain float reward is the single dimension ``value``
``agentlightning.message.body``            str         body of an ``emit_message`` span
``agentlightning.object.json``             str         JSON body of an ``emit_object`` span
``agentlightning.annotation.<key>``        any         user annotation of an ``emit_annotation`` span
``agentlightning.operation.input``         str         JSON of an ``operation``'s inputs
``agentlightning.operation.output``        str         JSON of an ``operation``'s output
``agentlightning.span.source``             str         who recorded the span: ``proxy``, ``hook``, ``emit``, ``otlp``
=========================================  ==========  ============================================================

Span events: a handoff between agents is an event named :data:`EVENT_HANDOFF` on the handing-off agent's span, with
``handoff.from_agent`` and ``handoff.to_agent``.

Span names: reward spans are named :data:`SPAN_REWARD`; LLM spans follow GenAI (``chat {model}``) and always carry
``gen_ai.operation.name = "chat"``; agent spans carry ``invoke_agent``; tool spans carry ``execute_tool``.
"""

from __future__ import annotations

from typing import Final

# --- OpenTelemetry GenAI semantic conventions -------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
ERROR_TYPE: Final = "error.type"

OP_CHAT: Final = "chat"
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_EXECUTE_TOOL: Final = "execute_tool"

# --- agentlightning.* extension ---------------------------------------------------------------------------------
ROLLOUT_ID: Final = "agentlightning.rollout_id"
ATTEMPT_ID: Final = "agentlightning.attempt_id"
PROMPT_TOKEN_IDS: Final = "agentlightning.prompt_token_ids"
RESPONSE_TOKEN_IDS: Final = "agentlightning.response_token_ids"
RESPONSE_LOGPROBS: Final = "agentlightning.response_logprobs"
POLICY_VERSION: Final = "agentlightning.policy_version"
REWARD_PREFIX: Final = "agentlightning.reward."
REWARD_PRIMARY: Final = "agentlightning.reward.primary"
MESSAGE_BODY: Final = "agentlightning.message.body"
OBJECT_JSON: Final = "agentlightning.object.json"
ANNOTATION_PREFIX: Final = "agentlightning.annotation."
OPERATION_INPUT: Final = "agentlightning.operation.input"
OPERATION_OUTPUT: Final = "agentlightning.operation.output"
REWARD_DEFAULT_DIMENSION: Final = "value"
SPAN_SOURCE: Final = "agentlightning.span.source"

SOURCE_PROXY: Final = "proxy"
SOURCE_HOOK: Final = "hook"
SOURCE_EMIT: Final = "emit"
SOURCE_OTLP: Final = "otlp"

# --- span names -------------------------------------------------------------------------------------------------
SPAN_REWARD: Final = "agentlightning.reward"
SPAN_MESSAGE: Final = "agentlightning.message"
SPAN_OBJECT: Final = "agentlightning.object"
SPAN_EXCEPTION: Final = "agentlightning.exception"
SPAN_ANNOTATION: Final = "agentlightning.annotation"
SPAN_OPERATION_PREFIX: Final = "agentlightning.operation."

# --- span events -------------------------------------------------------------------------------------------------
EVENT_HANDOFF: Final = "handoff"
HANDOFF_FROM_AGENT: Final = "handoff.from_agent"
HANDOFF_TO_AGENT: Final = "handoff.to_agent"

# --- HTTP headers (proxy and OTLP ingest attribute calls by these when the path does not) -----------------------
HEADER_ROLLOUT_ID: Final = "x-agentlightning-rollout-id"
HEADER_ATTEMPT_ID: Final = "x-agentlightning-attempt-id"
HEADER_POLICY_VERSION: Final = "x-agentlightning-policy-version"

# The entry-point group through which installed integrations announce themselves to core.
INTEGRATIONS_ENTRY_POINT_GROUP: Final = "agentlightning.integrations"


def reward_attribute(name: str) -> str:
    """The attribute key holding reward dimension ``name``."""
    return REWARD_PREFIX + name
