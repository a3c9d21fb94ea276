// Reward curves: one point per finished rollout (reward over enqueue time or resources version), grouped by mode,
// with a moving average per mode. Redrawn on every refresh, so training progress shows live.
import { api, setRefresh, updateQuery } from "./main.js";
import { empty, fmtReward, h, replace, s } from "./dom.js";

const W = 960;
const H = 400;
const PAD = { left: 56, right: 20, top: 20, bottom: 44 };
const MODES = ["train", "val", "test", "none"];

/** Build the page skeleton. */
export function mount(container) {
  const controls = h("div", { class: "filters" });
  const cards = h("div", { class: "cards" });
  const chart = h("div", { class: "card chart-card" });
  container.append(h("div", { class: "page-head" }, h("h1", { text: "Reward curves" }), controls), cards, chart);
  return { controls, cards, chart, last: "" };
}

/** Fetch the points and redraw when they changed. */
export async function refresh(state, query) {
  const axis = query.get("x") === "version" ? "version" : "time";
  const data = await api("/v1/dashboard/curve");
  setRefresh(data.refresh_s);
  const fingerprint = JSON.stringify([data.points, axis]);
  if (fingerprint === state.last) return;
  state.last = fingerprint;
  const toggle = (value, text) =>
    h("button", { class: `toggle ${axis === value ? "on" : ""}`, text, onclick: () => updateQuery({ x: value === "time" ? "" : value }) });
  replace(state.controls, h("span", { class: "muted", text: "x axis: " }), toggle("time", "enqueue time"), toggle("version", "resources version"));
  const groups = groupByMode(data.points);
  replace(state.cards, MODES.filter((m) => groups[m].length).map((m) => summaryCard(m, groups[m])));
  if (!data.points.length) {
    replace(state.chart, empty("No finished rollout with a reward yet. Points appear here as rollouts finish."));
    return;
  }
  replace(state.chart, chart(groups, axis), h("div", { class: "muted small", text: `${data.points.length} rewarded rollouts of the ${data.considered} most recent finished ones · ${axis === "version" ? "mean per version" : "moving average"} per mode · click a point to open its rollout` }));
}

function groupByMode(points) {
  const groups = Object.fromEntries(MODES.map((m) => [m, []]));
  for (const p of points) groups[p.mode || "none"].push(p);
  return groups;
}

function mean(values) {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

function summaryCard(mode, points) {
  const rewards = points.map((p) => p.reward);
  const window = Math.max(1, Math.ceil(rewards.length / 5));
  return h(
    "div",
    { class: `card stat mode-card-${mode}` },
    h("div", { class: "stat-label" }, h("span", { class: `dot dot-${mode}` }), mode === "none" ? "no mode" : mode),
    h("div", { class: "stat-value", text: fmtReward(mean(rewards.slice(-window))) }),
    h("div", { class: "muted small", text: `mean of last ${window} · ${points.length} rollouts · first ${fmtReward(mean(rewards.slice(0, window)))}` }),
  );
}

function xOf(p, axis) {
  return axis === "version" ? (p.resources_version ?? 0) : p.enqueue_ms;
}

function chart(groups, axis) {
  const all = MODES.flatMap((m) => groups[m]);
  let [x0, x1] = [Math.min(...all.map((p) => xOf(p, axis))), Math.max(...all.map((p) => xOf(p, axis)))];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (axis === "version") [x0, x1] = [x0 - 0.25, x1 + 0.25]; // keep each version's column off the axes
  let [y0, y1] = [Math.min(...all.map((p) => p.reward)), Math.max(...all.map((p) => p.reward))];
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const pad = (y1 - y0) * 0.08;
  [y0, y1] = [y0 - pad, y1 + pad];
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": "reward per rollout" });
  for (const t of ticks(y0, y1, 5)) {
    svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: sy(t), y2: sy(t), class: "gridline" }));
    svg.append(s("text", { x: PAD.left - 8, y: sy(t) + 4, class: "tick", "text-anchor": "end", text: Number(t.toFixed(3)) }));
  }
  const xticks = axis === "version" ? ticks(x0, x1, 6).filter((t) => Number.isInteger(t)) : ticks(x0, x1, 5);
  for (const t of xticks) {
    svg.append(s("line", { x1: sx(t), x2: sx(t), y1: H - PAD.bottom, y2: H - PAD.bottom + 5, class: "axisline" }));
    svg.append(s("text", { x: sx(t), y: H - PAD.bottom + 18, class: "tick", "text-anchor": "middle", text: axis === "version" ? `v${t}` : new Date(t).toLocaleTimeString() }));
  }
  svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, class: "axisline" }));
  svg.append(s("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom, class: "axisline" }));
  svg.append(s("text", { x: (W + PAD.left) / 2, y: H - 6, class: "axis-title", "text-anchor": "middle", text: axis === "version" ? "resources version" : "enqueue time" }));
  svg.append(s("text", { x: 14, y: (H - PAD.bottom) / 2, class: "axis-title", "text-anchor": "middle", transform: `rotate(-90 14 ${(H - PAD.bottom) / 2})`, text: "reward" }));
  for (const mode of MODES) {
    const points = groups[mode];
    if (!points.length) continue;
    const line = axis === "version" ? meanPerVersion(points) : movingAverage(points);
    if (line.length > 1) {
      svg.append(s("polyline", { class: `trend trend-${mode}`, points: line.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ") }));
    }
    for (const p of points) {
      const dot = s(
        "circle",
        { cx: sx(xOf(p, axis)), cy: sy(p.reward), r: 4, class: `pt pt-${mode}`, "data-rollout": p.rollout_id, onclick: () => (location.hash = `#/rollouts/${encodeURIComponent(p.rollout_id)}`) },
        s("title", { text: `${p.rollout_id}\n${mode} · reward ${fmtReward(p.reward)}${p.resources_version ? ` · v${p.resources_version}` : ""}` }),
      );
      svg.append(dot);
    }
  }
  const legend = h("div", { class: "legend" }, MODES.filter((m) => groups[m].length).map((m) => h("span", {}, h("span", { class: `dot dot-${m}` }), m === "none" ? "no mode" : m)));
  return [legend, svg];
}

function movingAverage(points) {
  const window = Math.max(1, Math.min(20, Math.round(points.length / 8)));
  return points.map((p, i) => {
    const slice = points.slice(Math.max(0, i - window + 1), i + 1);
    return [p.enqueue_ms, mean(slice.map((q) => q.reward))];
  });
}

function meanPerVersion(points) {
  const by = new Map();
  for (const p of points) {
    const v = p.resources_version ?? 0;
    if (!by.has(v)) by.set(v, []);
    by.get(v).push(p.reward);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]).map(([v, rs]) => [v, mean(rs)]);
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
