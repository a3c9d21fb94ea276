"""A store seeded like a small training run: several agents, rewards, retries, resources versions, live rollouts."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentlightning import semconv
from agentlightning.store.sqlite import SqliteLightningStore
from agentlightning.types import LLM, AttemptStatus, Attributes, MetricsRecord, PromptTemplate, Span

TRAINING_RUN = "lightning-rl-seeded"
TRAINING_STEPS = 12
DROPPED_AT = (6, 9)  # steps that dropped stale groups
VALIDATED_AT = (4, 8, 12)  # steps with a greedy validation reward
TRAIN_CURVE = [0.0, 0.2, 0.15, 0.3, 0.35, 0.3, 0.5, 0.45, 0.6, 0.7, 0.65, 0.8]
VAL_CURVE = [0.2, 0.4, 0.6]


@dataclass
class Seeded:
    """Ids and counts the browser tests check against."""

    writer_rollout: str = ""
    running_rollout: str = ""
    running_attempt: str = ""
    retried_rollout: str = ""
    crew_rollout: str = ""
    training_runs: tuple[str, ...] = ()
    rewarded: int = 0
    total: int = 0


class FakeClock:
    """Seeding time: two hours ago, advancing 40 s per reading, so curves and durations look like a real run."""

    def __init__(self) -> None:
        self.now = time.time_ns() - 2 * 3600 * 10**9
        self.step = 40 * 10**9

    def __call__(self) -> int:
        self.now += self.step
        return self.now


class SpanMaker:
    """Spans of one attempt with fresh ids and times from the fake clock."""

    _ids = itertools.count(1)

    def __init__(self, rollout_id: str, attempt_id: str, clock: Callable[[], int]) -> None:
        self.rollout_id, self.attempt_id, self.clock = rollout_id, attempt_id, clock
        self.trace_id = f"{next(self._ids):032x}"
        self.t = clock()

    def span(
        self,
        name: str,
        parent: Span | None = None,
        ms: float = 200.0,
        *,
        leaf: bool = True,
        attributes: Attributes | None = None,
    ) -> Span:
        """A finished span starting 20 ms after the previous one (or after the previous leaf's end)."""
        self.t += 20_000_000
        start = self.t
        if leaf:  # the next span starts after this one ends; containers enclose what follows them
            self.t += int(ms * 1e6)
        return Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            trace_id=self.trace_id,
            span_id=f"{next(self._ids):016x}",
            parent_id=parent.span_id if parent is not None else None,
            name=name,
            start_time=start,
            end_time=start + int(ms * 1e6),
            attributes=attributes or {},
        )

    def agent(self, name: str, parent: Span | None = None, ms: float = 900.0) -> Span:
        """An invoke_agent span."""
        return self.span(
            f"invoke_agent {name}",
            parent,
            ms,
            leaf=False,
            attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT, semconv.GEN_AI_AGENT_NAME: name},
        )

    def chat(self, parent: Span | None, agent: str, question: str, answer: str, ms: float = 300.0) -> Span:
        """An LLM call with messages, usage and engine token ids."""
        return self.span(
            "chat tiny-gpt",
            parent,
            ms,
            attributes={
                semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
                semconv.GEN_AI_AGENT_NAME: agent,
                semconv.GEN_AI_REQUEST_MODEL: "tiny-gpt",
                semconv.GEN_AI_USAGE_INPUT_TOKENS: 42,
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 9,
                semconv.GEN_AI_SYSTEM_INSTRUCTIONS: f"You are the {agent}.",
                semconv.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "content": question}]),
                semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "content": answer}]),
                semconv.PROMPT_TOKEN_IDS: list(range(42)),
                semconv.RESPONSE_TOKEN_IDS: list(range(9)),
            },
        )

    def tool(self, parent: Span | None, name: str, arguments: str, result: str) -> Span:
        """A tool call."""
        return self.span(
            f"execute_tool {name}",
            parent,
            80.0,
            attributes={
                semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL,
                semconv.GEN_AI_TOOL_NAME: name,
                semconv.GEN_AI_TOOL_CALL_ARGUMENTS: arguments,
                semconv.GEN_AI_TOOL_CALL_RESULT: result,
            },
        )

    def reward(self, value: float, parent: Span | None = None) -> Span:
        """A reward span with one dimension."""
        return self.span(
            semconv.SPAN_REWARD,
            parent,
            1.0,
            attributes={semconv.reward_attribute("value"): value, semconv.REWARD_PRIMARY: "value"},
        )


async def seed_store(path: Path) -> Seeded:
    """Fill a SQLite store at ``path`` and close it; the server reopens it."""
    clock = FakeClock()
    store = SqliteLightningStore(path, clock=clock)
    seeded = Seeded()
    template = "You write SQL for the question: {question}\nAnswer with one query."
    v1 = await store.add_resources(
        {
            "writer_prompt": PromptTemplate(template=template),
            "policy": LLM(base_url="http://127.0.0.1:9/v1", model="tiny-gpt", weights_version=0),
        }
    )
    v2 = await store.add_resources(
        {
            "writer_prompt": PromptTemplate(template=template.replace("one query", "one SQLite query, no prose")),
            "policy": LLM(base_url="http://127.0.0.1:9/v1", model="tiny-gpt", weights_version=1, api_key="sk-secret"),
        }
    )

    async def finish(rollout_id: str, attempt_id: str, spans: list[Span], status: AttemptStatus = "succeeded") -> None:
        await store.start_attempt(rollout_id, attempt_id)
        await store.add_spans(spans)
        await store.finish_attempt(rollout_id, attempt_id, status)

    async def claim(worker: str) -> tuple[str, str]:
        claimed = await store.claim_rollout(worker)
        assert claimed is not None
        return claimed.rollout.rollout_id, claimed.attempt.attempt_id

    # 1. A LangGraph-style SQL agent: writer (trained), a tool, checker (not trained), a final reward.
    await store.enqueue_rollout({"question": "How many singers are there?"}, mode="train", group_id="task-1")
    rid, aid = await claim("runner-1")
    m = SpanMaker(rid, aid, clock)
    graph = m.span("LangGraph", None, 1500.0, leaf=False)
    writer = m.agent("writer", graph)
    spans = [graph, writer, m.chat(writer, "writer", "How many singers are there?", "SELECT COUNT(*) FROM singer;")]
    spans.append(m.tool(writer, "run_sql", '{"query": "SELECT COUNT(*) FROM singer;"}', "[[6]]"))
    checker = m.agent("checker", graph)
    spans += [checker, m.chat(checker, "checker", "Is the query right?", "Looks correct.")]
    spans.append(m.reward(1.0, graph))
    await finish(rid, aid, spans)
    seeded.writer_rollout = rid

    # 2. A crew with a planner (val).
    await store.enqueue_rollout({"topic": "plan a trip"}, mode="val", group_id="task-2")
    rid, aid = await claim("runner-2")
    m = SpanMaker(rid, aid, clock)
    planner = m.agent("planner")
    await finish(
        rid, aid, [planner, m.chat(planner, "planner", "Plan a trip", "Day 1: museum."), m.reward(0.5, planner)]
    )
    seeded.crew_rollout = rid

    # 3. A retried rollout: the first attempt timed out, the second failed.
    await store.enqueue_rollout({"x": 3}, mode="train", max_attempts=2, retry_on=("timeout",), group_id="task-3")
    rid, aid = await claim("runner-3")
    await store.start_attempt(rid, aid)
    await store.finish_attempt(rid, aid, "timeout", error="attempt ran past timeout_s=30")
    rid, aid = await claim("runner-1")
    m = SpanMaker(rid, aid, clock)
    solver = m.agent("solver")
    await finish(rid, aid, [solver, m.chat(solver, "solver", "3 * 7?", "22")], "failed")
    seeded.retried_rollout = rid

    # 4. A training curve over two resources versions (the solver agent), and a validation curve.
    for i, reward in enumerate(TRAIN_CURVE):
        resources = v1 if i < len(TRAIN_CURVE) // 2 else v2
        await store.enqueue_rollout(
            {"n": i}, mode="train", group_id=f"math-{i % 4}", resources_id=resources.resources_id
        )
        rid, aid = await claim(f"runner-{1 + i % 3}")
        m = SpanMaker(rid, aid, clock)
        solver = m.agent("solver")
        await finish(rid, aid, [solver, m.chat(solver, "solver", f"{i} + {i}?", str(2 * i)), m.reward(reward, solver)])
    for i, reward in enumerate(VAL_CURVE):
        await store.enqueue_rollout({"n": i}, mode="val", group_id=f"math-val-{i}")
        rid, aid = await claim("runner-2")
        m = SpanMaker(rid, aid, clock)
        await finish(rid, aid, [m.chat(None, "solver", f"val {i}", "ok"), m.reward(reward)])

    # 5. Queued rollouts (enough for a second page) and one running now, which the live test posts a span to.
    for i in range(10):
        await store.enqueue_rollout({"later": i}, mode="train")
    await store.add_resources(
        {
            "writer_prompt": v2.resources["writer_prompt"],
            "policy": LLM(base_url="http://127.0.0.1:9/v1", model="tiny-gpt", weights_version=2),
        }
    )
    clock.step = 1_000_000  # the live rollout starts "now", so its worker counts as busy
    clock.now = time.time_ns()
    rid, aid = await claim("runner-live")
    await store.start_attempt(rid, aid)
    m = SpanMaker(rid, aid, clock)
    await store.add_spans([m.agent("writer")])
    seeded.running_rollout, seeded.running_attempt = rid, aid

    # 6. Per-step metrics of two LightningRL runs, as the trainer writes them (the newer run is shown first).
    await store.add_metrics(training_metrics())
    seeded.training_runs = (TRAINING_RUN, "older-run")

    seeded.rewarded = 2 + len(TRAIN_CURVE) + len(VAL_CURVE)  # the failed retry has no reward
    seeded.total = 3 + len(TRAIN_CURVE) + len(VAL_CURVE) + 10
    await store.close()
    return seeded


def training_metrics() -> list[MetricsRecord]:
    """An async run of TRAINING_STEPS steps (staleness 0-2, drops at DROPPED_AT) and an older three-step run."""
    start = time.time_ns() - 3600 * 10**9
    records = [
        MetricsRecord(
            run_id="older-run", step=s, time=start - 10**12 + s, values={"reward_mean": 0.1 * s, "staleness/0": 8}
        )
        for s in (1, 2, 3)
    ]
    for step in range(1, TRAINING_STEPS + 1):
        lagged = min(step - 1, 5)
        values = {
            "reward_mean": TRAIN_CURVE[step - 1],
            "reward_ema": sum(TRAIN_CURVE[:step]) / step,
            "policy_version": float(step - 1),
            "rollout_s": 2.0 + 0.1 * step,
            "update_s": 0.5 + 0.05 * step,
            "runner_idle_frac": 0.3 - 0.02 * step,
            "learner_idle_frac": 0.6 - 0.04 * step,
            "staleness/0": float(16 - lagged),
            "stale_groups_dropped": 2.0 if step in DROPPED_AT else 0.0,
            "stale_rollouts_dropped": 8.0 if step in DROPPED_AT else 0.0,
        }
        if step in VALIDATED_AT:
            values["val_reward"] = TRAIN_CURVE[step - 1] + 0.05
        if lagged:
            values["staleness/1"] = float(lagged - lagged // 3)
        if lagged >= 3:
            values["staleness/2"] = float(lagged // 3)
        records.append(MetricsRecord(run_id=TRAINING_RUN, step=step, time=start + step * 60 * 10**9, values=values))
    return records
