"""Every dashboard page in headless Chromium against a real server over a seeded store; screenshots as artifacts."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentlightning import semconv
from agentlightning.server import StoreServer
from agentlightning.store.memory import InMemoryLightningStore
from tests.dashboard._seed import (
    DROPPED_AT,
    TRAIN_CURVE,
    TRAINING_RUN,
    TRAINING_STEPS,
    VAL_CURVE,
    VALIDATED_AT,
    Seeded,
    training_metrics,
)
from tests.dashboard.conftest import screenshot

expect = pytest.importorskip(
    "playwright.sync_api", reason="the browser tests need playwright: pip install -r requirements-dev.txt"
).expect


def _open(page: Any, server: StoreServer, route: str) -> None:
    page.goto(f"{server.url}/#{route}")
    page.wait_for_selector("#live:has-text('live')")


def test_rollouts_table_filters_and_pages(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, "/rollouts")
    rows = page.locator("table.rollouts tbody tr")
    assert rows.count() == 25  # one full page of the 28 seeded rollouts, newest first
    assert rows.first.get_attribute("data-rollout") != seeded.writer_rollout
    for status in ("succeeded", "running", "queuing"):
        assert page.locator(f"table.rollouts .pill-{status}").count() >= 1, status
    assert page.locator("#stats").inner_text().startswith(f"{seeded.total} rollouts")
    screenshot(page, "rollouts")

    page.get_by_role("button", name="Older →").click()
    expect(page.locator("table.rollouts tbody tr")).to_have_count(3)
    assert seeded.writer_rollout in [rows.nth(i).get_attribute("data-rollout") for i in range(3)]
    assert page.locator("table.rollouts .pill-failed").count() == 1

    page.select_option("select[name=mode]", "val")
    expect(page.locator("table.rollouts tbody tr")).to_have_count(1 + len(VAL_CURVE))
    assert "offset" not in page.url  # a new filter starts at the first page

    page.select_option("select[name=mode]", "")
    page.select_option("select[name=agent]", "planner")
    expect(page.locator("table.rollouts tbody tr")).to_have_count(1)
    assert rows.first.get_attribute("data-rollout") == seeded.crew_rollout
    assert rows.first.locator("td.reward").inner_text() == "0.500"

    page.select_option("select[name=agent]", "")
    expect(page.locator("table.rollouts tbody tr")).to_have_count(25)
    page.select_option("select[name=status]", "failed")
    expect(page.locator("table.rollouts tbody tr")).to_have_count(1)
    assert rows.first.locator("td").nth(4).inner_text() == "2"  # attempts of the retried rollout


def test_clicking_a_rollout_shows_its_span_tree(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, "/rollouts?offset=25")
    page.click(f"tr[data-rollout='{seeded.writer_rollout}']")
    page.wait_for_selector(".span-row")
    assert seeded.writer_rollout in page.url
    names = page.locator(".span-row").evaluate_all("rows => rows.map(r => r.dataset.name)")
    assert names == [
        "LangGraph",
        "invoke_agent writer",
        "chat tiny-gpt",
        "execute_tool run_sql",
        "invoke_agent checker",
        "chat tiny-gpt",
        semconv.SPAN_REWARD,
    ]
    # Parents before children, indented by depth.
    indents = page.locator(".span-label").evaluate_all("labels => labels.map(l => parseFloat(l.style.paddingLeft))")
    assert indents[0] < indents[1] < indents[2] and indents[2] == indents[3] and indents[4] == indents[1]
    assert page.locator(".badge.transition").count() == 2
    assert page.locator(".badge.transition").first.inner_text() == "transition #0 · credit 1.000"
    assert "2 LLM calls → 2 training transitions" in page.locator(".adapter-line").text_content()
    assert page.locator(".badge.tokens").first.inner_text() == "42 → 9 tok"
    assert page.locator(".span-row.kind-reward .badge.reward").inner_text() == "reward 1.000"

    page.locator(".span-row.kind-llm").first.click()
    detail = page.locator(".span-detail")
    assert "How many singers are there?" in detail.locator(".msg-user").inner_text()
    assert "SELECT COUNT(*) FROM singer;" in detail.locator(".msg-assistant").inner_text()
    assert "You are the writer." in detail.locator(".msg-system").inner_text()
    page.locator(".span-row.kind-tool").click()
    assert '"query"' in page.locator(".span-detail").inner_text()
    page.locator(".span-row.kind-llm").first.click()
    screenshot(page, "rollout-detail")

    # Training only the writer: the checker's call stays in the tree but is no transition any more.
    page.fill("input[name=agents]", "writer")
    page.get_by_role("button", name="Recompute").click()
    expect(page.locator(".badge.transition")).to_have_count(1)
    assert (
        page.locator(".span-row", has=page.locator(".badge.transition")).locator(".badge.agent").inner_text()
        == "writer"
    )


def test_retried_rollout_lists_attempts(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, f"/rollouts/{seeded.retried_rollout}")
    attempts = page.locator("table.attempts tbody tr")
    assert attempts.count() == 2
    assert attempts.nth(0).locator(".pill").inner_text() == "timeout"
    assert "past timeout_s" in attempts.nth(0).inner_text()
    assert attempts.nth(1).locator(".pill").inner_text() == "failed"
    assert page.locator(".badge.warn", has_text="no reward recorded").count() == 1
    attempts.nth(0).click()
    page.wait_for_selector("text=No spans recorded for this attempt yet.")


def test_reward_curve_draws_every_point(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, "/curves?raw=1")
    page.wait_for_selector("svg.chart circle.pt")
    assert page.locator("circle.pt").count() == seeded.rewarded
    assert page.locator("circle.pt-train").count() == 1 + len(TRAIN_CURVE)
    assert page.locator("circle.pt-val").count() == 1 + len(VAL_CURVE)
    assert page.locator("polyline.mean-train").count() == 1 and page.locator("polygon.band-train").count() == 1
    assert "mean ± 1 standard error" in page.locator(".legend").inner_text()
    train_card = page.locator(".mode-card-train .stat-value").inner_text()
    assert float(train_card) > 0.5  # the seeded curve rises
    # Later train points sit higher on the chart (smaller y) than the first ones.
    ys = page.locator("circle.pt-train").evaluate_all("cs => cs.map(c => parseFloat(c.getAttribute('cy')))")
    assert sum(ys[-3:]) < sum(ys[1:4])
    screenshot(page, "reward-curves")
    expect(page.locator("text.x-tick", has_text="v2")).to_have_count(1)  # the x axis is the training step
    page.locator("circle.pt-val").first.click()
    page.wait_for_selector(".span-row")


def test_resources_history_shows_prompt_diffs(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, _ = seeded_server
    _open(page, server, "/resources")
    versions = page.locator("section.version")
    assert versions.count() == 3
    assert [versions.nth(i).get_attribute("data-version") for i in range(3)] == ["3", "2", "1"]
    v2 = page.locator("section.version[data-version='2']")
    assert v2.locator("pre.diff .diff-del").inner_text().strip() == "-Answer with one query."
    assert v2.locator("pre.diff .diff-add").inner_text().strip() == "+Answer with one SQLite query, no prose."
    change = v2.locator(".field-change[data-field='weights_version']")
    assert change.inner_text().split() == ["-weights_version:", "0", "+weights_version:", "1"]
    assert "Changed since v1: policy, writer_prompt" in v2.locator(".changes").inner_text()
    assert v2.locator(".badge.weights").inner_text() == "weights v1"
    assert page.locator("section.version[data-version='3'] .badge.weights").inner_text() == "weights v2"
    assert "sk-secret" not in page.content()  # API keys never reach the page
    screenshot(page, "resources")


def test_workers_show_heartbeats(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, _ = seeded_server
    _open(page, server, "/workers")
    rows = page.locator("table.workers tbody tr")
    assert rows.count() == 4
    live = page.locator("tr[data-worker='runner-live']")
    assert live.locator(".pill").inner_text() == "busy"
    assert re.search(r"ago|just now", live.locator("td").nth(2).inner_text())
    assert page.locator("tr[data-worker='runner-1'] .pill").inner_text() == "idle"
    screenshot(page, "workers")


def test_new_span_appears_without_reload(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, f"/rollouts/{seeded.running_rollout}")
    page.wait_for_selector(".span-row")
    page.evaluate("window.__notReloaded = true")
    assert page.locator(".span-row").count() == 1
    now = time.time_ns()
    span = {
        "rollout_id": seeded.running_rollout,
        "attempt_id": seeded.running_attempt,
        "trace_id": "f" * 32,
        "span_id": "e" * 16,
        "name": "late tool call",
        "start_time": now,
        "end_time": now + 5_000_000,
        "attributes": {semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL, semconv.GEN_AI_TOOL_NAME: "search"},
    }
    httpx.post(f"{server.url}/v1/spans", json={"spans": [span]}).raise_for_status()
    page.wait_for_selector(".span-row[data-name='late tool call']", timeout=8_000)  # refresh interval: 2 s
    assert page.evaluate("window.__notReloaded") is True
    screenshot(page, "live-span")


def test_reward_curve_grows_live(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, "/curves?raw=1")
    page.wait_for_selector("svg.chart circle.pt")
    points = page.locator("circle.pt")
    before = points.count()
    rid, aid = seeded.running_rollout, seeded.running_attempt
    now = time.time_ns()
    reward = {
        "rollout_id": rid,
        "attempt_id": aid,
        "trace_id": "f" * 32,
        "span_id": "d" * 16,
        "name": semconv.SPAN_REWARD,
        "start_time": now,
        "end_time": now,
        "attributes": {semconv.reward_attribute("value"): 0.9},
    }
    httpx.post(f"{server.url}/v1/spans", json={"spans": [reward]}).raise_for_status()
    httpx.post(f"{server.url}/v1/rollouts/{rid}/attempts/{aid}/finish", json={"status": "succeeded"}).raise_for_status()
    expect(points).to_have_count(before + 1, timeout=8_000)
    expect(page.locator(f"circle.pt[data-rollout='{rid}']")).to_have_count(1)


def test_training_view_draws_the_trainers_series(page: Any, seeded_server: tuple[StoreServer, Seeded]) -> None:
    server, seeded = seeded_server
    _open(page, server, "/training")
    page.wait_for_selector("section[data-chart=staleness] rect.lag")
    for series in ("reward_mean", "reward_ema", "runner_idle_frac", "learner_idle_frac", "rollout_s", "update_s"):
        assert page.locator(f"polyline.line[data-series={series}]").count() == 1, series
        assert page.locator(f"circle.pt-line[data-series={series}]").count() == TRAINING_STEPS, series
    # Validation is a point at each step that validated (no line between far-apart points is promised).
    validated = page.locator("circle.pt-line[data-series=val_reward]")
    assert sorted(int(validated.nth(i).get_attribute("data-step")) for i in range(validated.count())) == list(
        VALIDATED_AT
    )
    # One stacked bar segment per non-empty staleness bucket of every step, in the seeded counts.
    run = [r for r in training_metrics() if r.run_id == TRAINING_RUN]
    buckets = [k for r in run for k, v in r.values.items() if k.startswith("staleness/") and v]
    assert page.locator("rect.lag").count() == len(buckets)
    assert page.locator("rect.lag[data-step='6'][data-lag='2']").get_attribute("data-count") == "1"
    marks = page.locator("path.dropped-mark")
    assert sorted(int(marks.nth(i).get_attribute("data-step")) for i in range(marks.count())) == list(DROPPED_AT)
    cards = page.locator(".cards").inner_text()
    assert f"{len(DROPPED_AT) * 2} stale groups dropped" in cards and f"step {TRAINING_STEPS}" in cards
    screenshot(page, "training")

    options = page.locator("select[name=run] option")
    assert [options.nth(i).get_attribute("value") for i in range(options.count())] == list(seeded.training_runs)
    page.select_option("select[name=run]", "older-run")
    expect(page.locator("circle.pt-line[data-series=reward_mean]")).to_have_count(3)
    assert "run=older-run" in page.url
    expect(page.locator("polyline.line[data-series=reward_ema]")).to_have_count(0)  # that run never reported it


def test_training_view_says_how_to_get_metrics(page: Any) -> None:
    with StoreServer(InMemoryLightningStore()) as server:
        _open(page, server, "/training")
        empty = page.locator(".empty")
        expect(empty).to_contain_text("No training metrics in this store yet")
        assert "Run LightningRL against this store" in empty.inner_text()


def test_token_protected_store_asks_for_the_token(page: Any) -> None:
    with StoreServer(InMemoryLightningStore(), token="s3cret") as server:
        page.goto(f"{server.url}/#/rollouts")
        page.wait_for_selector("form.token-form")
        page.fill("#token-input", "s3cret")
        page.get_by_role("button", name="Open dashboard").click()
        page.wait_for_selector("text=No rollouts match these filters yet.")
        assert page.locator("#live").inner_text().startswith("live")


def _rgb(page: Any, selector: str) -> list[int]:
    """The computed text colour of the first match, as [r, g, b]."""
    colour = page.locator(selector).first.evaluate("el => getComputedStyle(el).color")
    return [int(n) for n in re.findall(r"\d+", colour)[:3]]


@pytest.mark.parametrize("width", [1400, 800])
def test_pages_fit_the_width_and_show_the_fixes(
    browser: Any, seeded_server: tuple[StoreServer, Seeded], tmp_path: Path, width: int
) -> None:
    server, seeded = seeded_server
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        routes = {
            "rollouts": ("/rollouts", "table.rollouts"),
            "detail": (f"/rollouts/{seeded.retried_rollout}", "table.attempts"),
            "curves": ("/curves", "svg.chart polyline.mean"),
            "resources": ("/resources", "section.version"),
            "workers": ("/workers", "table.workers"),
            "training": ("/training", "section[data-chart=staleness] rect.lag"),
        }
        for name, (route, ready) in routes.items():
            _open(page, server, route)
            page.wait_for_selector(ready)
            page.evaluate("() => window.scrollTo(0, 0)")
            page.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
            overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} overflows by {overflow} px at {width} px"
            if name == "rollouts":
                red, green, _ = _rgb(page, "td.reward[data-reward='0']")
                assert red > green, "a 0.000 reward must not be green"
                red, green, _ = _rgb(page, "td.reward[data-reward='0.8']")
                assert green > red
            if name == "detail":
                cells = page.locator("table.attempts td.heartbeat").all_inner_texts()
                assert cells and not any("ago" in c for c in cells), cells  # both attempts are finished
            if name == "curves":
                assert page.locator("polygon.band-train").count() == 1
                assert page.locator("circle.step-val").count() >= 1
                assert "training step" in (page.locator("text.x-title").text_content() or "")
                assert page.locator("circle.pt").count() == 0  # raw points only on demand
    finally:
        context.close()
