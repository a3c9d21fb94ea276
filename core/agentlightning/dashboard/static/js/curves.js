// Reward curves by training step: per mode, the mean reward of each resources version with a band of ±1 standard
// error, computed by the server over every rollout of the run; raw points only when asked for (the toggle).
import { api, setRefresh, updateQuery } from "./main.js";
import { empty, fmtReward, h, replace, s } from "./dom.js";

const W = 960;
const H = 400;
const PAD = { left: 56, right: 20, top: 20, bottom: 44 };
const NONE_X = 0; // rollouts without a resources snapshot sit left of v1
const modeLabel = (mode) => (mode === "none" ? "no mode" : mode);

/** Build the page skeleton. */
export function mount(container) {
  const controls = h("div", { class: "filters" });
  const notice = h("div");
  const cards = h("div", { class: "cards" });
  const chart = h("div", { class: "card chart-card" });
  container.append(h("div", { class: "page-head" }, h("h1", { text: "Reward curves" }), controls), notice, cards, chart);
  return { controls, notice, cards, chart, last: "" };
}

/** Fetch the per-step statistics (and raw points when toggled on) and redraw when they changed. */
export async function refresh(state, query) {
  const raw = query.get("raw") === "1";
  const data = await api("/v1/dashboard/curve", { points: raw ? "true" : "" });
  setRefresh(data.refresh_s);
  const fingerprint = JSON.stringify([data, raw]);
  if (fingerprint === state.last) return;
  state.last = fingerprint;
  replace(
    state.controls,
    h("button", { class: `toggle raw-toggle ${raw ? "on" : ""}`, text: raw ? "hide raw points" : "show raw points", "aria-pressed": raw ? "true" : "false", onclick: () => updateQuery({ raw: raw ? "" : "1" }) }),
  );
  const notes = [];
  if (data.unread) notes.push(h("div", { class: "notice partial", text: `Partial: ${data.unread} of ${data.scanned + data.unread} rollouts are not read yet; the curves fill in over the next refreshes.` }));
  if (raw && data.points_stride > 1) notes.push(h("div", { class: "notice sampled", text: `Raw points are sampled: showing ${data.points.length} of ${data.points_total} (one rollout in ${data.points_stride} per mode). Means and bands use every rollout.` }));
  replace(state.notice, notes);
  replace(state.cards, data.series.map(summaryCard));
  if (!data.series.length) {
    replace(state.chart, empty("No finished rollout with a reward yet. The curves appear here as rollouts finish."));
    return;
  }
  replace(
    state.chart,
    chart(data, raw),
    h("div", { class: "muted small chart-note", text: `Line: mean reward per training step; band: ${data.band}; over all ${data.rewarded} rewarded rollouts of the run (${data.scanned} read).${raw ? " Dots: one rollout each; click one to open it." : ""}` }),
  );
}

function summaryCard(series) {
  const first = series.steps[0];
  const last = series.steps[series.steps.length - 1];
  return h(
    "div",
    { class: `card stat mode-card-${series.mode}` },
    h("div", { class: "stat-label" }, h("span", { class: `dot dot-${series.mode}` }), modeLabel(series.mode)),
    h("div", { class: "stat-value", text: fmtReward(last.mean) }),
    h("div", { class: "muted small", text: `${stepLabel(last.version)}: mean of ${last.count} ± ${fmtReward(last.stderr)} · ${series.rollouts} rollouts · ${stepLabel(first.version)}: ${fmtReward(first.mean)}` }),
  );
}

function stepLabel(version) {
  return version === null ? "no snapshot" : `v${version}`;
}

function xOf(version) {
  return version === null ? NONE_X : version;
}

/** A point's offset inside its step column, fixed per rollout so dots do not jump between refreshes. */
function jitter(id) {
  let hash = 0;
  for (const c of id) hash = (hash * 31 + c.charCodeAt(0)) | 0;
  return ((Math.abs(hash) % 1000) / 1000 - 0.5) * 0.36;
}

function chart(data, raw) {
  const steps = data.series.flatMap((ser) => ser.steps);
  const xs = steps.map((st) => xOf(st.version));
  let [x0, x1] = [Math.min(...xs) - 0.5, Math.max(...xs) + 0.5];
  const ys = steps.flatMap((st) => [st.mean - st.stderr, st.mean + st.stderr]);
  if (raw) ys.push(...data.points.map((p) => p.reward));
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const pad = (y1 - y0) * 0.08;
  [y0, y1] = [y0 - pad, y1 + pad];
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": "mean reward per training step" });
  for (const t of ticks(y0, y1, 5)) {
    svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: sy(t), y2: sy(t), class: "gridline" }));
    svg.append(s("text", { x: PAD.left - 8, y: sy(t) + 4, class: "tick y-tick", "text-anchor": "end", text: Number(t.toFixed(3)) }));
  }
  const versions = [...new Set(xs)].sort((a, b) => a - b);
  const every = Math.max(1, Math.ceil(versions.length / 12)); // at most ~12 labels, whatever the run length
  versions.forEach((v, i) => {
    if (i % every && i !== versions.length - 1) return;
    svg.append(s("line", { x1: sx(v), x2: sx(v), y1: H - PAD.bottom, y2: H - PAD.bottom + 5, class: "axisline" }));
    svg.append(s("text", { x: sx(v), y: H - PAD.bottom + 18, class: "tick x-tick", "text-anchor": "middle", text: v === NONE_X && steps.some((st) => st.version === null) ? "none" : `v${v}` }));
  });
  svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, class: "axisline" }));
  svg.append(s("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom, class: "axisline" }));
  svg.append(s("text", { x: (W + PAD.left) / 2, y: H - 6, class: "axis-title x-title", "text-anchor": "middle", text: "training step (resources version)" }));
  svg.append(s("text", { x: 14, y: (H - PAD.bottom) / 2, class: "axis-title", "text-anchor": "middle", transform: `rotate(-90 14 ${(H - PAD.bottom) / 2})`, text: "reward" }));
  for (const ser of data.series) {
    const pts = ser.steps.map((st) => [sx(xOf(st.version)), sy(st.mean + st.stderr), sy(st.mean - st.stderr)]);
    // A single step has no width to shade: its band is a short bar around the one mean.
    const band = pts.length > 1 ? pts : [[pts[0][0] - 8, pts[0][1], pts[0][2]], [pts[0][0] + 8, pts[0][1], pts[0][2]]];
    const outline = [...band.map(([x, top]) => `${x.toFixed(1)},${top.toFixed(1)}`), ...band.reverse().map(([x, , bottom]) => `${x.toFixed(1)},${bottom.toFixed(1)}`)];
    svg.append(s("polygon", { class: `band band-${ser.mode}`, "data-mode": ser.mode, points: outline.join(" ") }));
    svg.append(s("polyline", { class: `mean mean-${ser.mode}`, "data-mode": ser.mode, points: ser.steps.map((st) => `${sx(xOf(st.version)).toFixed(1)},${sy(st.mean).toFixed(1)}`).join(" ") }));
  }
  if (raw) {
    for (const p of data.points) {
      svg.append(
        s(
          "circle",
          { cx: sx(xOf(p.resources_version) + jitter(p.rollout_id)), cy: sy(p.reward), r: 3, class: `pt pt-${p.mode}`, "data-rollout": p.rollout_id, onclick: () => (location.hash = `#/rollouts/${encodeURIComponent(p.rollout_id)}`) },
          s("title", { text: `${p.rollout_id}\n${modeLabel(p.mode)} · reward ${fmtReward(p.reward)} · ${stepLabel(p.resources_version)}` }),
        ),
      );
    }
  }
  for (const ser of data.series) {
    for (const st of ser.steps) {
      svg.append(
        s(
          "circle",
          { cx: sx(xOf(st.version)), cy: sy(st.mean), r: 4.5, class: `step step-${ser.mode}`, "data-mode": ser.mode, "data-version": st.version ?? "none", "data-mean": st.mean },
          s("title", { text: `${modeLabel(ser.mode)} · ${stepLabel(st.version)}\nmean ${fmtReward(st.mean)} ± ${fmtReward(st.stderr)} (standard error), ${st.count} rollouts\nmin ${fmtReward(st.low)} · max ${fmtReward(st.high)}` }),
        ),
      );
    }
  }
  const legend = h(
    "div",
    { class: "legend" },
    data.series.map((ser) => h("span", {}, h("span", { class: `dot dot-${ser.mode}` }), modeLabel(ser.mode))),
    h("span", { class: "muted band-legend" }, h("span", { class: "band-key" }), `band: ${data.band}`),
  );
  return [legend, svg];
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
