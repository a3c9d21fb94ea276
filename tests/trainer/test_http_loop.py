"""The full HTTP loop: runner → proxy → policy server process → spans with token ids → GRPO → hot-swapped weights."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agentlightning import semconv as sc
from agentlightning.adapter import TraceAdapter
from agentlightning.store import InMemoryLightningStore
from agentlightning.trainer import Trainer
from agentlightning.types import LLM
from agentlightning_trainer import tool_choice
from agentlightning_trainer.config import LightningRLConfig, PolicySpec
from agentlightning_trainer.lightning_rl import LightningRL
from agentlightning_trainer.quickstart.agent import tool_choice_agent


@pytest.mark.timeout(240)
def test_ten_steps_through_http(tool_spec: PolicySpec, tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    # One task has no answer key: its reward function raises, so its rollouts fail and are excluded.
    train = [*tool_choice.tasks(), {"request": "a task without an answer"}]
    config = LightningRLConfig(policy=tool_spec, steps=10, tasks_per_step=13, val_every=10, seed=0)
    algorithm = LightningRL(config, run_dir=tmp_path, show_progress=False)
    Trainer(algorithm, store=store, n_runners=32).fit(tool_choice_agent, train, tool_choice.tasks())

    assert algorithm.version == 10
    assert [m.step for m in algorithm.history] == list(range(1, 11))
    assert all(m.transitions == 192 and m.failed_rollouts == 16 for m in algorithm.history)
    assert all(m.policy_lag == 0.0 for m in algorithm.history)
    assert [s for s, _ in algorithm.val_history] == [0, 10]

    async def spans_of(mode: str) -> dict[str, list[tuple[int, list[int]]]]:
        out: dict[str, list[tuple[int, list[int]]]] = {}
        for rollout in await store.query_rollouts(mode=mode):  # type: ignore[arg-type]  # "train" / "val"
            spans = await store.query_spans(rollout.rollout_id, "latest")
            for span in spans:
                if span.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_CHAT:
                    version = span.attributes[sc.POLICY_VERSION]
                    assert isinstance(version, int)
                    response = span.attributes[sc.RESPONSE_TOKEN_IDS]
                    assert isinstance(response, list) and response
                    assert span.attributes[sc.PROMPT_TOKEN_IDS]
                    out.setdefault(str(rollout.input["request"]), []).append((version, [int(x) for x in response]))
        return out

    import asyncio

    val = asyncio.run(spans_of("val"))
    assert len(val) == 12
    # Greedy answers before training (version 0) and after 10 updates (version 10) differ for some request.
    changed = [req for req, calls in val.items() if dict(calls)[0] != dict(calls)[10]]
    assert changed, "served greedy outputs did not change after 10 updates"

    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    failed = [r for r in rollouts if r.status == "failed"]
    assert len(failed) == 160 and all("answer" not in str(r.input.get("tool", "")) for r in failed)
    sample = next(r for r in rollouts if r.status == "succeeded")
    rows = TraceAdapter().adapt(sample, asyncio.run(store.query_spans(sample.rollout_id, "latest")))
    assert rows and rows[0].has_token_ids and rows[0].response_logprobs


@pytest.mark.timeout(120)
def test_step_without_trainable_calls_is_skipped_with_the_reason(
    tool_spec: PolicySpec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = InMemoryLightningStore()
    config = LightningRLConfig(policy=tool_spec, steps=2, tasks_per_step=2, samples_per_task=2, agents="nobody")
    algorithm = LightningRL(config, run_dir=tmp_path, show_progress=False)
    with caplog.at_level(logging.WARNING):
        Trainer(algorithm, store=store, n_runners=4).fit(tool_choice_agent, tool_choice.tasks()[:2])
    assert all(m.skipped and m.transitions == 0 for m in algorithm.history)
    assert algorithm.version == 0
    assert "no trainable transitions" in caplog.text and "nobody" in caplog.text


@pytest.mark.timeout(120)
def test_a_run_with_nothing_to_train_stops_after_max_skipped_steps(tool_spec: PolicySpec, tmp_path: Path) -> None:
    """It used to idle through every step (200 by default) and exit as if it had trained."""
    config = LightningRLConfig(policy=tool_spec, steps=50, tasks_per_step=2, samples_per_task=2, agents="nobody",
                               max_skipped_steps=3)  # fmt: skip
    algorithm = LightningRL(config, run_dir=tmp_path, show_progress=False)
    trainer = Trainer(algorithm, store=InMemoryLightningStore(), n_runners=4)
    with pytest.raises(RuntimeError, match=r"3 steps in a row had nothing to train on.*nobody"):
        trainer.fit(tool_choice_agent, tool_choice.tasks()[:2])
    assert [m.step for m in algorithm.history] == [1, 2]  # the third skipped step stopped the run


@pytest.mark.timeout(180)
def test_lightning_rl_resumes_from_its_checkpoint(tool_spec: PolicySpec, tmp_path: Path) -> None:
    def fit(steps: int) -> LightningRL:
        config = LightningRLConfig(
            policy=tool_spec, steps=steps, tasks_per_step=2, samples_per_task=2, checkpoint_dir=tmp_path / "ckpt",
            checkpoint_every=1, log_dir=tmp_path / "tb",
        )  # fmt: skip
        algorithm = LightningRL(config, run_dir=tmp_path / f"run{steps}", show_progress=False)
        Trainer(algorithm, store=InMemoryLightningStore(), n_runners=4).fit(tool_choice_agent, tool_choice.tasks())
        return algorithm

    first = fit(2)
    assert first.version == 2 and (tmp_path / "ckpt" / "step-000002.pt").exists()
    resumed = fit(3)
    assert [m.step for m in resumed.history] == [3]
    assert resumed.version == 3
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


@pytest.mark.timeout(180)
def test_with_a_sqlite_store_the_proxy_runs_in_the_policy_server_process(
    tool_spec: PolicySpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning.store.sqlite import SqliteLightningStore
    from agentlightning_trainer import lightning_rl

    async def no_local_proxy(*args: object, **kwargs: object) -> None:
        raise AssertionError("the proxy was served in the trainer's process, not the policy server's")

    monkeypatch.setattr(lightning_rl, "start_proxy", no_local_proxy)
    config = LightningRLConfig(policy=tool_spec, steps=2, tasks_per_step=3, samples_per_task=2, seed=0)
    algorithm = LightningRL(config, run_dir=tmp_path, show_progress=False)
    Trainer(algorithm, store=tmp_path / "store.db", n_runners=4).fit(tool_choice_agent, tool_choice.tasks())

    assert algorithm.version == 2
    assert all(m.transitions == 6 and m.failed_rollouts == 0 for m in algorithm.history)

    import asyncio

    async def inspect() -> tuple[str, list[int]]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            snapshot = await store.get_resources()
            assert snapshot is not None
            versions: list[int] = []
            for rollout in await store.query_rollouts():
                for span in await store.query_spans(rollout.rollout_id, "latest"):
                    if span.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_CHAT:
                        assert span.attributes[sc.PROMPT_TOKEN_IDS] and span.attributes[sc.RESPONSE_TOKEN_IDS]
                        version = span.attributes[sc.POLICY_VERSION]
                        assert isinstance(version, int)
                        versions.append(version)
            llm = snapshot.resources["llm"]
            assert isinstance(llm, LLM)
            return llm.base_url, sorted(versions)
        finally:
            await store.close()

    proxy_url, versions = asyncio.run(inspect())
    assert versions == [0] * 6 + [1] * 6
    assert proxy_url.startswith("http://127.0.0.1:")
    log = (tmp_path / "policy_server.log").read_text()
    assert "Traceback" not in log, log
