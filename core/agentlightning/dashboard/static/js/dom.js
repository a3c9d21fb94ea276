// Small DOM and formatting helpers. Every value from the store is set with textContent, never parsed as HTML:
// span attributes carry model output, which is untrusted text.

const SVG_NS = "http://www.w3.org/2000/svg";

/** Build an element: h("div", {class: "x", onclick: fn}, child, "text", [more children]). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  applyAttrs(el, attrs);
  append(el, children);
  return el;
}

/** Build an SVG element with the same calling convention as h(). */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyAttrs(el, attrs);
  append(el, children);
  return el;
}

function applyAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else if (key === "style") Object.assign(el.style, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace all children of el. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** A reward as text: three decimals, or a dash. */
export function fmtReward(value) {
  return value === null || value === undefined ? "—" : Number(value).toFixed(3);
}

/** The [lo, hi] range a reward colour scale spans: 0..1 (the usual success reward), widened to hold every value. */
export function rewardRange(values) {
  const known = values.filter((v) => v !== null && v !== undefined);
  return [Math.min(0, ...known), Math.max(1, ...known)];
}

/** Hue of a reward on a red → amber → green scale over [lo, hi].

lo maps to red (hue 0), the middle of the range to amber (hue 40) and hi to green (hue 130), linearly in between,
so the colour says where a reward sits in the range: a 0.000 on a 0..1 reward is red, never green. */
export function rewardHue(value, [lo, hi] = [0, 1]) {
  const t = hi > lo ? Math.min(1, Math.max(0, (value - lo) / (hi - lo))) : 0.5;
  return t < 0.5 ? t * 2 * 40 : 40 + (t - 0.5) * 2 * 90;
}

/** Inline colours of a reward value (text) or badge (tinted background), from rewardHue(); nothing for no reward. */
export function rewardStyle(value, range, kind = "text") {
  if (value === null || value === undefined) return undefined;
  const hue = rewardHue(value, range);
  if (kind === "solid") return { backgroundColor: `hsl(${hue}, 62%, 36%)`, color: "#fff" };
  if (kind === "badge") return { backgroundColor: `hsl(${hue}, 80%, 91%)`, color: `hsl(${hue}, 75%, 27%)` };
  return { color: `hsl(${hue}, 72%, 36%)` };
}

/** A duration in seconds as "850 ms", "12.4 s", "3 m 20 s", "2 h 5 m". */
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} m ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} m`;
}

/** Milliseconds as "12 ms" or "1.25 s". */
export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms < 1000 ? `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

/** Epoch milliseconds as local "YYYY-MM-DD HH:MM:SS". */
export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** How long ago an epoch-ms instant was: "4 s ago". */
export function fmtAgo(ms) {
  if (ms === null || ms === undefined) return "—";
  const seconds = Math.max(0, (Date.now() - ms) / 1000);
  return seconds < 1 ? "just now" : `${fmtDuration(seconds).replace(/\.\d s$/, " s")} ago`;
}

/** A long id shortened for tables, full id in the title. */
export function shortId(id, keep = 12) {
  if (!id) return h("span", { class: "muted", text: "—" });
  return h("span", { class: "mono", title: id, text: id.length > keep + 3 ? `${id.slice(0, keep)}…` : id });
}

/** A colored status pill. */
export function pill(status) {
  return h("span", { class: `pill pill-${status}`, text: status });
}

/** A small labelled badge. */
export function badge(text, kind = "") {
  return h("span", { class: `badge ${kind}`, text });
}

/** A "label: value" pair for header cards. */
export function field(label, value) {
  return h("div", { class: "field" }, h("div", { class: "field-label", text: label }), h("div", { class: "field-value" }, value));
}

/** Pretty JSON text of any value. */
export function pretty(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

/** An empty-state box. */
export function empty(text) {
  return h("div", { class: "empty", text });
}
