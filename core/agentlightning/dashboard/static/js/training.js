// Training: the per-step metrics a trainer (LightningRL) wrote to the store with add_metrics — reward mean and
// EMA, the staleness histogram of the transitions it trained on, runner and learner idle shares, step durations.
import { api, setRefresh, updateQuery } from "./main.js";
import { empty, fmtDuration, fmtReward, fmtTime, h, replace, s } from "./dom.js";

// Drawn at about the width a chart gets in the two-column layout, so its text stays ~11 px at 1400 px wide.
const W = 640;
const H = 250;
const PAD = { left: 52, right: 12, top: 14, bottom: 40 };
const MAX_LAG_CLASS = 4; // lags past this share the last colour; the legend says "4+"
const pct = (v) => (v === null || v === undefined ? "—" : `${Math.round(v * 100)}%`);

/** Build the page skeleton. */
export function mount(container) {
  const controls = h("div", { class: "filters" });
  const notice = h("div");
  const cards = h("div", { class: "cards" });
  const charts = h("div", { class: "training-charts" });
  container.append(h("div", { class: "page-head" }, h("h1", { text: "Training" }), controls), notice, cards, charts);
  return { controls, notice, cards, charts, last: "" };
}

/** Fetch the chosen run's steps and redraw when they changed. */
export async function refresh(state, query) {
  const data = await api("/v1/dashboard/training", { run_id: query.get("run") || "" });
  setRefresh(data.refresh_s);
  const fingerprint = JSON.stringify(data);
  if (fingerprint === state.last) return;
  state.last = fingerprint;
  replace(state.controls, runPicker(data));
  replace(state.notice, data.earlier ? h("div", { class: "notice partial", text: `Showing the latest ${data.steps.length} steps; ${data.earlier} earlier steps of this run are left out.` }) : null);
  if (!data.steps.length) {
    replace(state.cards);
    const text = data.runs.length
      ? `Run ${data.run_id} has no metrics in this store. Pick another run above.`
      : "No training metrics in this store yet. Run LightningRL against this store (agl train --store <this server's URL>, or Trainer(algorithm, store=...) in Python): each step's reward, staleness, idle shares and durations appear here as the step ends.";
    replace(state.charts, empty(text));
    return;
  }
  replace(state.cards, summaryCards(data));
  replace(
    state.charts,
    chartCard("Reward per step", "reward", [legendItem("line-reward", "mean"), legendItem("line-ema", "EMA"), legendItem("line-val", "validation (greedy)")], lineChart(data.steps, [
      { key: "reward_mean", cls: "line-reward", label: "reward mean", fmt: fmtReward },
      { key: "reward_ema", cls: "line-ema", label: "reward EMA", fmt: fmtReward },
      { key: "val_reward", cls: "line-val", label: "validation reward", fmt: fmtReward },
    ], { title: "reward" })),
    chartCard("Staleness of trained transitions", "staleness", stalenessLegend(data.steps), stalenessChart(data.steps)),
    chartCard("Idle share", "idle", [legendItem("line-runner", "runners idle"), legendItem("line-learner", "learner idle")], lineChart(data.steps, [
      { key: "runner_idle_frac", cls: "line-runner", label: "runners idle", fmt: pct },
      { key: "learner_idle_frac", cls: "line-learner", label: "learner idle", fmt: pct },
    ], { title: "share of the step", y0: 0, y1: 1, fmtTick: (t) => `${Math.round(t * 100)}%` })),
    chartCard("Step time", "durations", [legendItem("line-rollout", "rollouts (rollout_s)"), legendItem("line-update", "update (update_s)")], lineChart(data.steps, [
      { key: "rollout_s", cls: "line-rollout", label: "rollouts", fmt: fmtDuration },
      { key: "update_s", cls: "line-update", label: "update", fmt: fmtDuration },
    ], { title: "seconds", y0: 0 })),
  );
}

function runPicker(data) {
  if (data.runs.length <= 1) return data.run_id ? h("span", { class: "muted small" }, "run ", h("span", { class: "mono", text: data.run_id })) : null;
  const select = h(
    "select",
    { name: "run", "aria-label": "training run", onchange: (event) => updateQuery({ run: event.target.value }) },
    data.runs.map((run) => h("option", { value: run.run_id, selected: run.run_id === data.run_id, text: `${run.run_id} · ${run.steps} steps · ${fmtTime(run.last_ms)}` })),
  );
  return h("label", { class: "run-picker" }, h("span", { class: "muted small", text: "run" }), select);
}

function summaryCards(data) {
  const steps = data.steps;
  const last = steps[steps.length - 1];
  const lagged = steps.reduce((n, st) => n + st.staleness.slice(1).reduce((a, b) => a + b, 0), 0);
  const trained = steps.reduce((n, st) => n + st.staleness.reduce((a, b) => a + b, 0), 0);
  const dropped = steps.reduce((n, st) => n + st.stale_groups_dropped, 0);
  const card = (label, value, note) => h("div", { class: "card stat" }, h("div", { class: "stat-label", text: label }), h("div", { class: "stat-value", text: value }), h("div", { class: "muted small", text: note }));
  return [
    card("reward (EMA)", fmtReward(last.reward_ema), `step ${last.step}: mean ${fmtReward(last.reward_mean)} · policy v${last.policy_version ?? "—"}`),
    card("stale transitions", trained ? `${Math.round((lagged / trained) * 100)}%` : "—", `${lagged} of ${trained} trained ≥ 1 version behind · ${dropped} stale groups dropped`),
    card("idle (last step)", `${pct(last.runner_idle_frac)} / ${pct(last.learner_idle_frac)}`, "runners / learner"),
    card("step time (last)", fmtDuration((last.rollout_s || 0) + (last.update_s || 0)), `rollouts ${fmtDuration(last.rollout_s)} · update ${fmtDuration(last.update_s)}`),
  ];
}

function chartCard(title, name, legend, svg) {
  return h("section", { class: "card chart-card training-chart", "data-chart": name }, h("h2", { text: title }), h("div", { class: "legend" }, legend), svg);
}

function legendItem(cls, text) {
  return h("span", {}, h("span", { class: `key ${cls}` }), text);
}

/** The x scale shared by every chart: one column per step, so the charts line up. */
function xScale(steps) {
  const x0 = steps[0].step - 0.5;
  const x1 = steps[steps.length - 1].step + 0.5;
  return (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
}

function frame(steps, sy, ticks, fmtTick, title, label) {
  const sx = xScale(steps);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": label });
  for (const t of ticks) {
    svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: sy(t), y2: sy(t), class: "gridline" }));
    svg.append(s("text", { x: PAD.left - 8, y: sy(t) + 4, class: "tick y-tick", "text-anchor": "end", text: fmtTick(t) }));
  }
  const every = Math.max(1, Math.ceil(steps.length / 10)); // at most ~10 step labels, whatever the run length
  steps.forEach((st, i) => {
    if (i % every && i !== steps.length - 1) return;
    svg.append(s("text", { x: sx(st.step), y: H - PAD.bottom + 16, class: "tick x-tick", "text-anchor": "middle", text: st.step }));
  });
  svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, class: "axisline" }));
  svg.append(s("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom, class: "axisline" }));
  svg.append(s("text", { x: (W + PAD.left) / 2, y: H - 6, class: "axis-title x-title", "text-anchor": "middle", text: "training step" }));
  svg.append(s("text", { x: 14, y: (H - PAD.bottom) / 2, class: "axis-title", "text-anchor": "middle", transform: `rotate(-90 14 ${(H - PAD.bottom) / 2})`, text: title }));
  return { svg, sx };
}

function yScale(lo, hi) {
  return (y) => H - PAD.bottom - ((y - lo) / (hi - lo)) * (H - PAD.top - PAD.bottom);
}

/** Lines of some per-step values; a step without a value breaks its line (a gap, not a made-up point). */
function lineChart(steps, series, { title, y0, y1, fmtTick = (t) => Number(t.toPrecision(4)) }) {
  const values = steps.flatMap((st) => series.map((ser) => st[ser.key])).filter((v) => v !== null && v !== undefined);
  let lo = y0 ?? Math.min(...values);
  let hi = y1 ?? Math.max(...values);
  if (!values.length) [lo, hi] = [0, 1];
  if (lo === hi) [lo, hi] = [lo - 0.5, hi + 0.5];
  if (y0 === undefined || y1 === undefined) {
    const pad = (hi - lo) * 0.08;
    if (y0 === undefined) lo -= pad;
    if (y1 === undefined) hi += pad;
  }
  const sy = yScale(lo, hi);
  const { svg, sx } = frame(steps, sy, ticks(lo, hi, 4), fmtTick, title, series.map((ser) => ser.label).join(", "));
  for (const ser of series) {
    let run = [];
    const flush = () => {
      if (run.length > 1) svg.append(s("polyline", { class: `line ${ser.cls}`, "data-series": ser.key, points: run.join(" ") }));
      run = [];
    };
    for (const st of steps) {
      const v = st[ser.key];
      if (v === null || v === undefined) {
        flush();
        continue;
      }
      run.push(`${sx(st.step).toFixed(1)},${sy(v).toFixed(1)}`);
    }
    flush();
    for (const st of steps) {
      const v = st[ser.key];
      if (v === null || v === undefined) continue;
      svg.append(s("circle", { cx: sx(st.step), cy: sy(v), r: steps.length > 60 ? 1.8 : 3.2, class: `pt-line ${ser.cls}`, "data-series": ser.key, "data-step": st.step }, s("title", { text: `step ${st.step} · ${ser.label} ${ser.fmt(v)}` })));
    }
  }
  return svg;
}

/** Stacked bars per step: trained transitions by versions behind (0 at the bottom); a red mark over a step that
dropped stale groups. */
function stalenessChart(steps) {
  const totals = steps.map((st) => st.staleness.reduce((a, b) => a + b, 0));
  const hi = Math.max(1, ...totals) * 1.12;
  const sy = yScale(0, hi);
  const { svg, sx } = frame(steps, sy, ticks(0, hi, 4).filter((t) => Number.isInteger(t)), (t) => t, "transitions", "trained transitions per step by versions behind");
  const slot = (W - PAD.left - PAD.right) / steps.length;
  const width = Math.max(1, Math.min(24, slot * 0.7));
  for (const st of steps) {
    let base = 0;
    st.staleness.forEach((count, lag) => {
      if (!count) return;
      const top = base + count;
      svg.append(
        s(
          "rect",
          { x: sx(st.step) - width / 2, y: sy(top), width, height: Math.max(0.5, sy(base) - sy(top)), class: `lag lag-${Math.min(lag, MAX_LAG_CLASS)}`, "data-step": st.step, "data-lag": lag, "data-count": count },
          s("title", { text: `step ${st.step} · ${count} transitions ${lag} version${lag === 1 ? "" : "s"} behind` }),
        ),
      );
      base = top;
    });
    if (st.stale_groups_dropped > 0) {
      const y = sy(base) - 8;
      svg.append(
        s(
          "path",
          { d: `M${(sx(st.step) - 5).toFixed(1)},${(y - 7).toFixed(1)} h10 l-5,7 z`, class: "dropped-mark", "data-step": st.step, "data-dropped": st.stale_groups_dropped },
          s("title", { text: `step ${st.step} · ${st.stale_groups_dropped} stale group(s) dropped (${st.stale_rollouts_dropped} rollouts), older than max_staleness` }),
        ),
      );
    }
  }
  return svg;
}

function stalenessLegend(steps) {
  const maxLag = Math.max(0, ...steps.map((st) => st.staleness.length - 1));
  const items = [];
  for (let lag = 0; lag <= Math.min(maxLag, MAX_LAG_CLASS); lag++) {
    const text = lag === MAX_LAG_CLASS && maxLag > MAX_LAG_CLASS ? `${lag}+ behind` : lag === 0 ? "current policy" : `${lag} behind`;
    items.push(legendItem(`lag-${lag}`, text));
  }
  items.push(h("span", {}, h("span", { class: "key dropped-key" }), "stale groups dropped"));
  return items;
}

function ticks(lo, hi, count) {
  const step = niceStep((hi - lo) / count);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  const f = raw / power;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * power;
}
