"""``agl check``: is what the store holds trainable? Per rollout, what the adapter finds, and the fix for each gap."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentlightning import semconv
from agentlightning.adapter.calls import LLMCall
from agentlightning.adapter.retokenize import FIX_DRIFT, Retokenized, RetokenizeMode, Retokenizer, trains
from agentlightning.adapter.selection import AgentSelector, AgentSpec
from agentlightning.adapter.trace import TraceAdapter
from agentlightning.conventions import CONVENTION, LOG_EVENT_NAME, LOG_SOURCE, MISSING
from agentlightning.emit import find_rewards
from agentlightning.store.base import LightningStore
from agentlightning.types import Span

if TYPE_CHECKING:
    from rich.console import Console

FIX_NO_SPANS = "no spans recorded: run the agent through a Runner (or rollout_context) that traces into this store"
FIX_NO_CALLS = (
    "no LLM calls found (no span with gen_ai.operation.name='chat'): install the framework's integration "
    '(pip install "agent-lightning[langchain]", [autogen], [openai-agents], [crewai]) or route the calls through '
    "the proxy (LLM.base_url_for)"
)
FIX_NO_TOKEN_IDS = (
    "route the agent's LLM calls through the proxy (LLM.base_url_for) or use an upstream that returns token ids"
)
FIX_NO_REWARD = "no reward: return a float from the rollout function or call emit_reward(...)"
FIX_LONE_LOG_RECORDS = (
    "export the traces too (the span exporter to <store>/v1/traces with the same attempt headers as the log "
    "exporter) and sample every LLM span (OTEL_TRACES_SAMPLER=always_on): a span the sampler drops can still have its "
    "log records exported"
)
HINT_RETOKENIZE = (
    "; or re-tokenise them with the trained model's tokenizer: agl check --policy SPEC says whether that drifts"
)


@dataclass(slots=True)
class RolloutCheck:
    """What the adapter finds in one rollout's latest attempt, and one line of fix per problem."""

    rollout_id: str
    status: str
    attempt_id: str | None = None
    spans: int = 0
    calls_found: int = 0
    calls_selected: int = 0
    calls_with_token_ids: int = 0
    """Selected calls carrying prompt and response token ids."""
    calls_retokenized: int = 0
    """Selected calls without token ids whose re-tokenised ids train (``retokenize`` mode; needs a retokenizer)."""
    calls_drifting: int = 0
    """Re-tokenised calls whose recorded usage disagrees with the re-tokenised lengths."""
    calls_unverified: int = 0
    """Re-tokenised calls without recorded usage counts to check them against."""
    rewards_found: int = 0
    long_prompts: int = 0
    long_responses: int = 0
    agents_seen: list[str] = field(default_factory=list[str])
    problems: list[str] = field(default_factory=list[str])
    trainable_calls: int = 0
    """Selected calls with token ids (recorded, or re-tokenised and kept) within the length limits (0 when the rollout
    has no reward)."""

    @property
    def trainable(self) -> bool:
        """True when at least one selected call can become an RL training row."""
        return self.trainable_calls > 0


@dataclass(slots=True)
class CheckReport:
    """The result of :func:`check_store`: one :class:`RolloutCheck` per rollout."""

    selection: str
    """The agent selection, as it reads in a message (``agent 'writer'``)."""
    rollouts: list[RolloutCheck] = field(default_factory=list[RolloutCheck])
    missing_rollout_ids: list[str] = field(default_factory=list[str])

    @property
    def trainable(self) -> bool:
        """True when any rollout is trainable (``agl check`` exits non-zero otherwise)."""
        return any(r.trainable for r in self.rollouts)

    @property
    def problems(self) -> list[str]:
        """Every fix line, prefixed with its rollout id."""
        lines = [f"{rid}: not found in the store" for rid in self.missing_rollout_ids]
        lines.extend(f"{r.rollout_id}: {p}" for r in self.rollouts for p in r.problems)
        return lines

    def summary(self) -> str:
        """One line: how many rollouts and calls are trainable."""
        good = sum(r.trainable for r in self.rollouts)
        calls = sum(r.trainable_calls for r in self.rollouts)
        total = _count(len(self.rollouts), "rollout")
        return f"{good} of {total} trainable ({_count(calls, 'call')}) for {self.selection}"

    def render(self, console: Console) -> None:
        """Print the report as a rich table, then the summary line."""
        from rich.markup import escape
        from rich.table import Table

        # Fix lines hold package text such as pip extras ("agent-lightning[langchain]"): escaped, or rich eats them.
        table = Table(title=escape(f"agl check: {self.selection}"), show_lines=True)
        for column in ("rollout", "status", "calls", "selected", "token ids", "rewards", "too long", "ok", "fix"):
            table.add_column(column, overflow="fold", no_wrap=column in ("rollout", "status"))
        for r in self.rollouts:
            table.add_row(
                r.rollout_id,
                r.status,
                str(r.calls_found),
                str(r.calls_selected),
                f"{r.calls_with_token_ids}/{r.calls_selected}"
                + (f" +{r.calls_retokenized} re-tokenised" if r.calls_retokenized else ""),
                str(r.rewards_found),
                f"{r.long_prompts}p {r.long_responses}r" if r.long_prompts or r.long_responses else "-",
                "[green]yes[/]" if r.trainable else "[red]no[/]",
                escape("\n".join(r.problems)) or "-",
            )
        for rid in self.missing_rollout_ids:
            table.add_row(rid, "missing", "-", "-", "-", "-", "-", "[red]no[/]", "not found in the store")
        console.print(table)
        style = "green" if self.trainable else "red"
        console.print(f"[{style}]{escape(self.summary())}[/]")


async def check_store(
    store: LightningStore,
    *,
    agents: AgentSpec = None,
    rollout_ids: Sequence[str] | None = None,
    max_prompt_tokens: int | None = None,
    max_response_tokens: int | None = None,
    limit: int | None = None,
    retokenizer: Retokenizer | None = None,
    retokenize: RetokenizeMode = "matching",
) -> CheckReport:
    """Run the adapter over the store's rollouts (latest attempt each) and report what training would get.

    With a ``retokenizer`` (the trained model's tokenizer, ``agl check --policy SPEC``), selected calls without token
    ids are re-tokenised and checked against their recorded usage; they count as trainable as ``retokenize`` says.
    """
    selector = AgentSelector.of(agents)
    adapter = TraceAdapter(agents=selector, include_messages=False)
    rollouts = await store.query_rollouts(rollout_ids=rollout_ids, limit=limit)
    report = CheckReport(selection=selector.describe())
    if rollout_ids is not None:
        found = {r.rollout_id for r in rollouts}
        report.missing_rollout_ids = [rid for rid in rollout_ids if rid not in found]
    for rollout in rollouts:
        spans = await store.query_spans(rollout.rollout_id, "latest")
        check = RolloutCheck(rollout_id=rollout.rollout_id, status=rollout.status, spans=len(spans))
        report.rollouts.append(check)
        if not spans:
            check.problems.append(FIX_NO_SPANS)
            continue
        trace = adapter.trace(spans)
        check.attempt_id = trace.attempt_id
        check.calls_found = len(trace.calls)
        check.calls_selected = len(trace.selected)
        check.rewards_found = len(trace.rewards)
        check.agents_seen = sorted({c.agent_name for c in trace.calls if c.agent_name is not None})
        flagged = _flagged_foreign(trace.tree.spans.values())
        if flagged:
            check.problems.append(flagged)
        lone = _lone_log_records(spans)
        if lone:
            check.problems.append(lone)
        if not trace.calls:
            check.problems.append(FIX_NO_CALLS)
        elif not trace.selected:
            check.problems.append(_no_match_line(selector, check.agents_seen, trace.calls))
        ok_calls = 0
        lengths: list[tuple[int, int]] = []  # (prompt, response) token counts of the calls training would use
        retokenized: list[Retokenized] = []
        for call in trace.selected:
            if call.has_token_ids:
                check.calls_with_token_ids += 1
                lengths.append((len(call.prompt_token_ids), len(call.response_token_ids)))
            elif retokenizer is not None and retokenize != "off":
                result = retokenizer(call)
                retokenized.append(result)
                if not trains(result, retokenize):
                    continue
                check.calls_retokenized += 1
                lengths.append((len(result.prompt_token_ids), len(result.response_token_ids)))
            else:
                continue
            prompt_len, response_len = lengths[-1]
            too_long = False
            if max_prompt_tokens is not None and prompt_len > max_prompt_tokens:
                check.long_prompts += 1
                too_long = True
            if max_response_tokens is not None and response_len > max_response_tokens:
                check.long_responses += 1
                too_long = True
            ok_calls += not too_long
        missing_ids = check.calls_selected - check.calls_with_token_ids
        if missing_ids and retokenizer is None:
            check.problems.append(_token_ids_line(missing_ids, check.calls_selected, trace.calls) + HINT_RETOKENIZE)
        elif retokenized:
            check.problems.extend(_retokenize_lines(check, retokenized, retokenize))
        if check.long_prompts:
            longest = max(p for p, _ in lengths)
            check.problems.append(
                f"{_count(check.long_prompts, 'prompt')} over max_prompt_tokens={max_prompt_tokens} "
                f"(longest {longest}): raise the limit or shorten the agent's context "
                "(fewer turns, truncated tool results)"
            )
        if check.long_responses:
            longest = max(r for _, r in lengths)
            check.problems.append(
                f"{_count(check.long_responses, 'response')} over max_response_tokens={max_response_tokens} "
                f"(longest {longest}): raise the limit or lower max_tokens in the LLM resource's sampling"
            )
        if not trace.rewards:
            check.problems.append(_no_reward_line(trace.tree.spans.values()))
        check.trainable_calls = ok_calls if trace.rewards else 0
    return report


def _flagged_foreign(spans: Iterable[Span]) -> str | None:
    """One line for spans of a foreign convention stored unmapped because they lack what a call needs."""
    flagged = [s for s in spans if s.attributes.get(MISSING)]
    if not flagged:
        return None
    by_convention: dict[str, set[str]] = {}
    for span in flagged:
        missing = span.attributes[MISSING]
        names = [str(m) for m in missing] if isinstance(missing, list) else [str(missing)]
        by_convention.setdefault(str(span.attributes.get(CONVENTION, "a foreign convention")), set()).update(names)
    what = "; ".join(f"{name} without {', '.join(sorted(names))}" for name, names in sorted(by_convention.items()))
    return (
        f"foreign-convention spans without what an LLM or tool call needs: {len(flagged)} ({what}); stored "
        "unmapped, they train nothing: enable the instrumentation's message capture, or route "
        "the model through the proxy (llm.base_url) to record the calls with token ids"
    )


def _lone_log_records(spans: Sequence[Span]) -> str | None:
    """One line for GenAI log records whose LLM span is not in the attempt: their messages reach no call."""
    span_ids = {s.span_id for s in spans if s.attributes.get(semconv.SPAN_SOURCE) != LOG_SOURCE}
    lone = [
        s
        for s in spans
        if s.attributes.get(semconv.SPAN_SOURCE) == LOG_SOURCE
        and s.parent_id is not None
        and s.parent_id not in span_ids
        and str(s.attributes.get(LOG_EVENT_NAME, s.name)).startswith("gen_ai.")
    ]
    if not lone:
        return None
    parents = len({s.parent_id for s in lone})
    return (
        f"{_count(len(lone), 'GenAI log record')} whose LLM span never arrived ({_count(parents, 'span')} missing): "
        f"their messages train nothing; {FIX_LONE_LOG_RECORDS}"
    )


def _retokenize_lines(check: RolloutCheck, results: Sequence[Retokenized], mode: RetokenizeMode) -> list[str]:
    """What re-tokenising the calls without token ids found: drift, calls without usage, calls it cannot render."""
    lines: list[str] = []
    drifting = [r for r in results if r.verdict == "drift"]
    unverified = [r for r in results if r.verdict == "unverified"]
    failed = [r for r in results if r.verdict == "failed"]
    check.calls_drifting, check.calls_unverified = len(drifting), len(unverified)
    fate = "trained anyway (retokenize='all')" if mode == "all" else "skipped"
    if drifting:
        lines.append(
            f"re-tokenisation drift in {_count(len(drifting), 'call')} without token ids ({drifting[0].lengths()}): "
            f"{fate}; {FIX_DRIFT}"
        )
    if unverified:
        lines.append(
            f"no recorded usage for {_count(len(unverified), 're-tokenised call')} (gen_ai.usage.input_tokens/"
            f"output_tokens), so drift cannot be ruled out: {fate}; {FIX_DRIFT}"
        )
    if failed:
        lines.append(
            f"{_count(len(failed), 'call')} without token ids cannot be re-tokenised ({failed[0].error or 'no ids'}): "
            f"{FIX_NO_TOKEN_IDS}"
        )
    return lines


def _no_match_line(selector: AgentSelector, agents_seen: list[str], calls: Sequence[LLMCall]) -> str:
    seen = ", ".join(agents_seen) if agents_seen else "none"
    line = f"no calls matched {selector.describe()}; agents seen: {seen}"
    unnamed = sum(1 for c in calls if c.agent_name is None)
    if unnamed:
        line += (
            f" ({_count(unnamed, 'call')} without an agent name: the integration must set gen_ai.agent.name on LLM or "
            "agent spans)"
        )
    return line


def _token_ids_line(missing: int, selected: int, calls: Sequence[LLMCall]) -> str:
    head = "no token ids" if missing == selected else f"{missing} of {_count(selected, 'selected call')} lack token ids"
    line = f"{head}: {FIX_NO_TOKEN_IDS}"
    proxy_only = sum(1 for c in calls if c.sources == (semconv.SOURCE_PROXY,))
    unjoinable = sum(1 for c in calls if c.response_id is None and semconv.SOURCE_PROXY not in c.sources)
    if proxy_only and unjoinable:
        line += (
            f" ({_count(unjoinable, 'hook span')} without gen_ai.response.id cannot be joined with the proxy's "
            f"{_count(proxy_only, 'span')}, so those calls count twice)"
        )
    return line


def _no_reward_line(spans: Iterable[Span]) -> str:
    unreadable = sum(1 for reward in find_rewards(spans) if reward.value is None)
    if unreadable:
        return (
            f"no readable reward: {_count(unreadable, 'reward span')} with several dimensions and no "
            "agentlightning.reward.primary; pass primary=... to emit_reward"
        )
    return FIX_NO_REWARD


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
