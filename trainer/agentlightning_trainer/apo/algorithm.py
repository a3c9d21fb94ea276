"""APO: automatic prompt optimisation by critique-and-edit with a beam search over one or several prompt templates.

Each round, every candidate kept in the beam runs on a training batch (rollouts enqueued with its own resources
snapshot); the optimiser LLM reads the worst runs, writes a critique of one template and then an edited template;
every edit is validated (never installed when empty, unchanged, unparseable, or when it loses or adds placeholders)
and scored on the validation batch; the best ``beam_width`` candidates survive. The run ends after ``rounds``, at
``target_reward``, or when the rollout budget cannot pay for the next batch. The best templates are then published
as the store's latest snapshot (the next algorithm on the store, e.g. LightningRL via ``Sequential``, runs with them)
and written with the whole search history to ``run_dir``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from agentlightning.algorithm import Algorithm
from agentlightning.proxy.server import ServedProxy, start_proxy
from agentlightning.store.base import LightningStore
from agentlightning.types import PromptTemplate, Resource
from agentlightning_trainer.apo.config import APOConfig
from agentlightning_trainer.apo.optimizer import (
    CandidateRejected,
    OptimizerLLM,
    check_optimizer_prompts,
    critique_request,
    edit_request,
    load_optimizer_prompt,
    validate_candidate,
)
from agentlightning_trainer.batches import (
    RolloutOutcome,
    mean_reward,
    publish_resources,
    read_outcomes,
    run_batch,
)
from agentlightning_trainer.inprocess import pick_tasks

logger = logging.getLogger(__name__)

CandidateStatus = Literal["seed", "scored", "rejected", "unscored"]


@dataclass
class Candidate:
    """One set of templates in the search: where it came from, why, and how it scored."""

    candidate_id: str
    templates: dict[str, PromptTemplate]
    round: int
    parent: str | None = None
    edited: str | None = None
    critique: str | None = None
    status: CandidateStatus = "seed"
    reason: str | None = None
    val_reward: float | None = None
    train_reward: float | None = None
    resources_id: str | None = None
    optimizer_output: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The candidate as written to ``history.json``."""
        data = asdict(self)
        data["templates"] = {k: {"template": v.template, "engine": v.engine} for k, v in self.templates.items()}
        return data


@dataclass
class _Search:
    """Mutable state of one run."""

    candidates: list[Candidate] = field(default_factory=list[Candidate])
    seen: dict[tuple[tuple[str, str], ...], str] = field(default_factory=dict[tuple[tuple[str, str], ...], str])
    rollouts_used: int = 0


class APO(Algorithm):
    """Critique-and-edit prompt optimisation with a beam search (see the module docstring).

    After :meth:`run`: :attr:`history` (every candidate), :attr:`best`, :attr:`seed_reward` (validation reward of
    the seed templates), :attr:`val_history` ((round, best validation reward) pairs, round 0 = seed) and
    :attr:`rollouts_used` are filled in.
    """

    def __init__(
        self,
        config: APOConfig | None = None,
        *,
        show_progress: bool = True,
        console: Console | None = None,
        **overrides: Any,
    ) -> None:
        """Validate the config now (``overrides`` are config fields) and load the optimiser's prompt files."""
        if config is None and not overrides:
            raise ValueError(
                "APO needs an optimiser endpoint: APO(APOConfig(optimizer_base_url=..., optimizer_model=...))"
            )
        data = {**(config.model_dump() if config else {}), **overrides}
        self.config: APOConfig = APOConfig.model_validate(data) if overrides or config is None else config
        self.critique_prompt = load_optimizer_prompt("critique", self.config.critique_template)
        self.edit_prompt = load_optimizer_prompt("edit", self.config.edit_template)
        check_optimizer_prompts(self.critique_prompt, self.edit_prompt)
        self.show_progress = show_progress
        self.console = console or Console(stderr=True)
        self.history: list[Candidate] = []
        self.best: Candidate | None = None
        self.seed_reward: float | None = None
        self.val_history: list[tuple[int, float]] = []
        self.rollouts_used = 0
        self.run_dir: Path | None = None

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Search for better templates against ``store`` (see the module docstring)."""
        from agentlightning.adapter import TraceAdapter

        cfg = self.config
        if not train_tasks:
            raise ValueError("APO needs training tasks (their failures drive the critique): trainer.fit(agent, train)")
        self.run_dir = cfg.run_dir or Path(tempfile.mkdtemp(prefix="apo-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        latest = await store.get_resources()
        base: dict[str, Resource] = dict(latest.resources) if latest is not None else {}
        seeds = dict(cfg.seed_templates) or {k: v for k, v in base.items() if isinstance(v, PromptTemplate)}
        if not seeds:
            raise ValueError(
                "APO found no prompt template to optimise: pass APOConfig(seed_templates={'prompt_template': "
                "PromptTemplate(template=...)}) or publish one with store.add_resources(...) before fit"
            )
        names = cfg.optimize or tuple(seeds)
        missing = sorted(set(names) - seeds.keys())
        if missing:
            raise ValueError(f"optimize names {missing}, which are not among the templates {sorted(seeds)}")
        rng = random.Random(cfg.seed)
        val_pool = list(val_tasks or train_tasks)
        val_batch = rng.sample(val_pool, min(cfg.val_batch_size or len(val_pool), len(val_pool)))
        if cfg.rollout_budget is not None and cfg.rollout_budget < len(val_batch) + cfg.train_batch_size:
            raise ValueError(
                f"rollout_budget {cfg.rollout_budget} cannot pay for scoring the seed ({len(val_batch)} validation "
                f"rollouts) and one training batch ({cfg.train_batch_size}); raise it or lower val_batch_size"
            )
        TraceAdapter(agents=cfg.agents)  # a bad agent pattern fails here, before any rollout runs
        llm = OptimizerLLM(
            cfg.optimizer_base_url, cfg.optimizer_model, cfg.optimizer_api_key, cfg.optimizer_temperature,
            cfg.optimizer_timeout_s,
        )  # fmt: skip
        proxy: ServedProxy | None = None
        search = _Search()
        try:
            if cfg.agent_llm is not None:
                proxy = await start_proxy(
                    store,
                    cfg.agent_llm.base_url,
                    request_token_ids=cfg.agent_llm_token_ids,
                    upstream_api_key=cfg.agent_llm.api_key,
                )
                base[cfg.llm_resource] = cfg.agent_llm.model_copy(update={"base_url": proxy.url, "proxied": True})
            seed = Candidate("c0", seeds, 0)
            self._remember(search, seed)
            self._reserve(search, len(val_batch))  # checked against the budget above
            await self._score(store, [seed], val_batch, base, proxy)
            self.seed_reward = seed.val_reward
            beam = [seed]
            self.val_history.append((0, seed.val_reward or 0.0))
            self._say(f"APO: seed templates score {seed.val_reward:.3f} on {len(val_batch)} validation tasks")
            for round_index in range(1, cfg.rounds + 1):
                if self._reached(beam):
                    break
                children: list[Candidate] = []
                spent = False
                for parent in beam:
                    if not self._reserve(search, cfg.train_batch_size):
                        spent = True
                        break
                    batch = pick_tasks(rng, train_tasks, cfg.train_batch_size)
                    outcomes = await self._run(store, parent, batch, "train", base, proxy, round_index)
                    parent.train_reward = mean_reward(outcomes)
                    for branch in range(cfg.branch_factor):
                        name = names[((round_index - 1) * cfg.branch_factor + branch) % len(names)]
                        child = await self._propose(llm, search, parent, name, seeds[name], outcomes, round_index)
                        children.append(child)
                valid = [c for c in children if c.status != "rejected"]
                affordable: list[Candidate] = []
                for candidate in valid:
                    if self._reserve(search, len(val_batch)):
                        affordable.append(candidate)
                    else:
                        candidate.reason = "not scored: rollout budget spent"
                await self._score(store, affordable, val_batch, base, proxy)
                pool = [c for c in [*beam, *valid] if c.val_reward is not None]
                beam = sorted(pool, key=lambda c: -(c.val_reward or 0.0))[: cfg.beam_width]
                if children:
                    self.val_history.append((round_index, beam[0].val_reward or 0.0))
                    self._report_round(round_index, children, beam)
                if spent or len(affordable) < len(valid):
                    self._say(f"APO: rollout budget spent ({search.rollouts_used} of {cfg.rollout_budget}); stopping")
                    break
            self.best = beam[0]
            # The proxy stops with this run: the final snapshot names the agent's model itself, so that whoever runs
            # the agent next (a deployment, or the next algorithm on the store) reaches it.
            if cfg.agent_llm is not None:
                base[cfg.llm_resource] = cfg.agent_llm
            final = await publish_resources(store, self.best.templates, base=base)
            self._say(
                f"APO: best {self.best.candidate_id} scores {self.best.val_reward:.3f} (seed {self.seed_reward:.3f}); "
                f"published as resources {final.resources_id}; {search.rollouts_used} rollouts used"
            )
        finally:
            self.history = search.candidates
            self.rollouts_used = search.rollouts_used
            self._save(search)
            await llm.close()
            if proxy is not None:
                await proxy.stop()

    # --- steps -------------------------------------------------------------------------------------------------
    async def _propose(
        self,
        llm: OptimizerLLM,
        search: _Search,
        parent: Candidate,
        name: str,
        seed: PromptTemplate,
        outcomes: Sequence[RolloutOutcome],
        round_index: int,
    ) -> Candidate:
        """Critique template ``name`` of ``parent`` on its runs, ask for an edit, validate it into a child."""
        cfg = self.config
        child = Candidate(f"c{len(search.candidates)}", dict(parent.templates), round_index, parent.candidate_id, name)
        search.candidates.append(child)
        current = parent.templates[name]
        prompt = critique_request(
            self.critique_prompt, name, parent.templates, outcomes,
            max_examples=cfg.max_examples, max_example_chars=cfg.max_example_chars,
        )  # fmt: skip
        try:
            child.critique = (await llm.complete(prompt)).strip()
            answer = await llm.complete(edit_request(self.edit_prompt, name, current, seed, child.critique))
        except Exception as exc:  # an optimiser outage costs this child, not the run; the reason is kept
            return self._reject(child, f"template {name!r}: optimiser call failed: {type(exc).__name__}: {exc}")
        child.optimizer_output = answer[:4000]
        try:
            child.templates[name] = validate_candidate(
                name, answer, seed=seed, current=current, max_chars=cfg.max_template_chars
            )
        except CandidateRejected as exc:
            return self._reject(child, str(exc))
        duplicate = search.seen.get(_key(child.templates))
        if duplicate is not None:
            return self._reject(child, f"template {name!r}: same templates as {duplicate}, already scored")
        self._remember(search, child, append=False)
        child.status = "unscored"
        return child

    async def _score(
        self,
        store: LightningStore,
        candidates: Sequence[Candidate],
        val_batch: Sequence[Any],
        base: dict[str, Resource],
        proxy: ServedProxy | None,
    ) -> None:
        """Validation reward of each candidate, every candidate's batch in flight at once."""
        results = await asyncio.gather(
            *(self._run(store, c, val_batch, "val", base, proxy, c.round) for c in candidates)
        )
        for candidate, outcomes in zip(candidates, results, strict=True):
            candidate.val_reward = mean_reward(outcomes)
            if candidate.status != "seed":
                candidate.status = "scored"

    async def _run(
        self,
        store: LightningStore,
        candidate: Candidate,
        tasks: Sequence[Any],
        mode: Literal["train", "val"],
        base: dict[str, Resource],
        proxy: ServedProxy | None,
        round_index: int,
    ) -> list[RolloutOutcome]:
        """Run ``tasks`` with the candidate's templates (its own snapshot, published on first use)."""
        from agentlightning.adapter import TraceAdapter

        if candidate.resources_id is None:
            snapshot = await publish_resources(store, candidate.templates, base=base)
            candidate.resources_id = snapshot.resources_id
        rollouts = await run_batch(
            store, tasks, mode=mode, resources_id=candidate.resources_id,
            group_prefix=f"apo-r{round_index}-{candidate.candidate_id}-{mode}", timeout_s=self.config.rollout_timeout_s,
        )  # fmt: skip
        if proxy is not None:
            await proxy.flush()
        if mode == "val":  # scoring needs the rewards only
            return await read_outcomes(store, rollouts, None)
        adapter = TraceAdapter(agents=self.config.agents, credit="identical", include_messages=True)
        return await read_outcomes(store, rollouts, adapter)

    # --- bookkeeping -------------------------------------------------------------------------------------------
    def _reserve(self, search: _Search, n: int) -> bool:
        """Count ``n`` more rollouts, or return False when that would exceed the budget."""
        budget = self.config.rollout_budget
        if budget is not None and search.rollouts_used + n > budget:
            return False
        search.rollouts_used += n
        return True

    def _reached(self, beam: Sequence[Candidate]) -> bool:
        target = self.config.target_reward
        return target is not None and bool(beam) and (beam[0].val_reward or 0.0) >= target

    @staticmethod
    def _remember(search: _Search, candidate: Candidate, *, append: bool = True) -> None:
        if append:
            search.candidates.append(candidate)
        search.seen[_key(candidate.templates)] = candidate.candidate_id

    @staticmethod
    def _reject(child: Candidate, reason: str) -> Candidate:
        child.status = "rejected"
        child.reason = reason
        child.templates = {}  # a rejected edit is never installed; keep only the raw answer and the reason
        logger.warning("APO rejected candidate %s (parent %s): %s", child.candidate_id, child.parent, reason)
        return child

    def _say(self, message: str) -> None:
        logger.info(message)
        if self.show_progress:
            self.console.print(message)

    def _report_round(self, round_index: int, children: Sequence[Candidate], beam: Sequence[Candidate]) -> None:
        """One rich table per round: every child, its parent, edited template, status and score."""
        if not self.show_progress:
            return
        table = Table(title=f"APO round {round_index}: best {beam[0].candidate_id} = {beam[0].val_reward:.3f}")
        for column in ("candidate", "parent", "edited", "status", "val reward", "reason"):
            table.add_column(column)
        kept = {c.candidate_id for c in beam}
        for c in children:
            score = "-" if c.val_reward is None else f"{c.val_reward:.3f}"
            status = f"{c.status} (kept)" if c.candidate_id in kept else c.status
            table.add_row(c.candidate_id, c.parent or "-", c.edited or "-", status, score, c.reason or "")
        self.console.print(table)

    def _save(self, search: _Search) -> None:
        """Write ``history.json`` (every candidate) and ``best.json`` (best templates and scores)."""
        if self.run_dir is None:
            return
        history = [c.to_json() for c in search.candidates]
        (self.run_dir / "history.json").write_text(json.dumps(history, indent=2, ensure_ascii=False))
        if self.best is not None:
            best = {
                "candidate_id": self.best.candidate_id,
                "val_reward": self.best.val_reward,
                "seed_val_reward": self.seed_reward,
                "templates": self.best.to_json()["templates"],
                "val_history": self.val_history,
                "rollouts_used": search.rollouts_used,
                "rollout_budget": self.config.rollout_budget,
            }
            (self.run_dir / "best.json").write_text(json.dumps(best, indent=2, ensure_ascii=False))


def _key(templates: dict[str, PromptTemplate]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v.template) for k, v in templates.items()))


__all__ = ["APO", "Candidate"]
