// Rollout detail: header, attempts, and the span tree as a timeline with the adapter's transitions and credit.
import { api, setRefresh, updateQuery } from "./main.js";
import { badge, empty, field, fmtAgo, fmtDuration, fmtMs, fmtReward, fmtTime, h, pill, pretty, replace, rewardRange, rewardStyle, shortId } from "./dom.js";

const KIND_LABEL = { agent: "agent", llm: "LLM", tool: "tool", reward: "reward", other: "span" };

/** Build the page skeleton for one rollout. */
export function mount(container, [rolloutId]) {
  const head = h("div", { class: "page-head" });
  const summary = h("div");
  const attempts = h("div");
  const adapter = h("div");
  const tree = h("div", { class: "card tree-card" });
  container.append(head, summary, attempts, adapter, tree);
  return { rolloutId, head, summary, attempts, adapter, tree, last: "", selected: null, collapsed: new Set() };
}

/** Fetch the rollout and redraw the parts that changed. */
export async function refresh(state, query) {
  const data = await api(`/v1/dashboard/rollouts/${encodeURIComponent(state.rolloutId)}`, {
    attempt_id: query.get("attempt"),
    agents: query.get("agents"),
    credit: query.get("credit"),
  });
  setRefresh(data.refresh_s);
  const fingerprint = JSON.stringify([data.rollout, data.attempts, data.spans, data.rewards, data.adapter_error]);
  if (fingerprint === state.last) return;
  state.last = fingerprint;
  state.data = data;
  // One colour scale per attempt, so a step reward and the final one compare at a glance.
  state.range = rewardRange([...data.rewards.map((r) => r.value), ...data.spans.map((sp) => sp.reward)]);
  drawHead(state, data);
  drawAttempts(state, data);
  drawAdapter(state, data);
  drawTree(state);
}

function drawHead(state, data) {
  const r = data.rollout;
  const final = data.rewards.length ? data.rewards[data.rewards.length - 1].value : null;
  const duration = r.start_time ? ((r.end_time ?? Date.now() * 1e6) - r.start_time) / 1e9 : null;
  replace(
    state.head,
    h("a", { href: "#/rollouts", class: "back", text: "← Rollouts" }),
    h("h1", {}, h("span", { class: "mono", text: r.rollout_id }), " ", pill(r.status)),
  );
  replace(
    state.summary,
    h(
      "div",
      { class: "card fields" },
      field("Mode", r.mode || "—"),
      field("Group", r.group_id ? shortId(r.group_id, 20) : "—"),
      field("Attempts", `${r.num_attempts} of ${r.config.max_attempts}`),
      field("Final reward", h("span", { class: "reward", text: fmtReward(final), style: rewardStyle(final, state.range) })),
      field("Resources", data.resources_version === null ? "—" : `v${data.resources_version}`),
      field("Enqueued", fmtTime(r.enqueue_time / 1e6)),
      field("Duration", fmtDuration(duration)),
      field("Spans", String(data.span_count)),
    ),
    h("details", { class: "card input" }, h("summary", { text: "Task input & metadata" }), h("pre", { text: pretty({ input: r.input, metadata: r.metadata, config: r.config }) })),
  );
}

function drawAttempts(state, data) {
  if (!data.attempts.length) {
    replace(state.attempts, empty("Not claimed by a runner yet."));
    return;
  }
  const rows = data.attempts.map((a) =>
    h(
      "tr",
      {
        class: `clickable ${a.attempt_id === data.attempt_id ? "current" : ""}`,
        onclick: () => updateQuery({ attempt: a.attempt_id }),
      },
      h("td", { class: "num", text: `#${a.sequence_id}` }),
      h("td", {}, shortId(a.attempt_id, 14)),
      h("td", {}, pill(a.status)),
      h("td", {}, a.worker_id ? shortId(a.worker_id, 18) : "—"),
      h("td", { class: "nowrap", text: fmtTime(a.start_time / 1e6) }),
      h("td", { class: "num", text: fmtDuration(((a.end_time ?? Date.now() * 1e6) - a.start_time) / 1e9) }),
      h("td", { class: "nowrap heartbeat", text: heartbeat(a) }),
      h("td", { class: "error-text", text: a.error || "" }),
    ),
  );
  const head = ["", "Attempt", "Status", "Worker", "Started", "Duration", "Heartbeat", "Error"];
  replace(
    state.attempts,
    h("h2", { text: "Attempts" }),
    h("div", { class: "table-wrap attempts-wrap" }, h("table", { class: "grid attempts" }, h("thead", {}, h("tr", {}, head.map((t) => h("th", { text: t })))), h("tbody", {}, rows))),
  );
}

const LIVE_ATTEMPT = new Set(["preparing", "running"]);

/** "4 s ago" for a live attempt; a finished attempt has no heartbeat to age, so it shows when it ended. */
function heartbeat(a) {
  if (LIVE_ATTEMPT.has(a.status)) return a.last_heartbeat_time ? fmtAgo(a.last_heartbeat_time / 1e6) : "none yet";
  return a.end_time ? `ended ${fmtTime(a.end_time / 1e6)}` : "—";
}

function drawAdapter(state, data) {
  const rewards = data.rewards.map((r) => {
    const el = badge(`${r.is_final ? "final" : "step"} ${fmtReward(r.value)} after ${r.after_calls} call${r.after_calls === 1 ? "" : "s"}`, r.is_final ? "reward final" : "reward");
    Object.assign(el.style, rewardStyle(r.value, state.range, r.is_final ? "solid" : "badge"));
    return el;
  });
  const agentsInput = h("input", { name: "agents", placeholder: "all agents (e.g. writer,re:re.*)", value: data.agents || "" });
  const creditSelect = h(
    "select",
    { name: "credit" },
    ["per_call", "identical", "discounted"].map((c) => h("option", { value: c, text: c, selected: c === data.credit })),
  );
  const form = h(
    "form",
    {
      class: "inline-form",
      onsubmit: (event) => {
        event.preventDefault();
        updateQuery({ agents: agentsInput.value.trim(), credit: creditSelect.value });
      },
    },
    h("label", {}, "Train agents ", agentsInput),
    h("label", {}, "credit ", creditSelect),
    h("button", { type: "submit", text: "Recompute" }),
  );
  replace(
    state.adapter,
    h(
      "div",
      { class: "card adapter" },
      h(
        "div",
        { class: "adapter-line" },
        h("b", { text: `${data.llm_calls} LLM call${data.llm_calls === 1 ? "" : "s"}` }),
        " → ",
        h("b", { class: "transition-text", text: `${data.transitions} training transition${data.transitions === 1 ? "" : "s"}` }),
        h("span", { class: "muted", text: ` (credit: ${data.credit}) ` }),
        rewards.length ? rewards : badge("no reward recorded", "warn"),
      ),
      form,
      data.adapter_error ? h("div", { class: "alert", text: `Adapter failed: ${data.adapter_error}` }) : null,
    ),
  );
}

function drawTree(state) {
  const { spans } = state.data;
  if (!spans.length) {
    replace(state.tree, h("h2", { text: "Span tree" }), empty("No spans recorded for this attempt yet."));
    return;
  }
  const end = Math.max(1, ...spans.map((s) => s.start_ms + (s.duration_ms ?? 0)));
  const hasChildren = new Set(spans.map((s) => s.parent_id).filter(Boolean));
  const hidden = new Set();
  const rows = [];
  for (const span of spans) {
    if ((span.parent_id && hidden.has(span.parent_id)) || (span.parent_id && state.collapsed.has(span.parent_id) && !span.orphan)) {
      hidden.add(span.span_id);
      continue;
    }
    rows.push(spanRow(state, span, end, hasChildren.has(span.span_id)));
    if (state.selected === span.span_id) rows.push(spanDetail(span));
  }
  replace(
    state.tree,
    h("div", { class: "tree-head" }, h("h2", { text: "Span tree" }), h("span", { class: "muted", text: `${spans.length} spans · ${fmtMs(end)} · click a span for its messages and attributes` })),
    h("div", { class: "tree-cols" }, h("div", { text: "Span" }), h("div", { class: "axis" }, h("span", { text: "0" }), h("span", { text: fmtMs(end / 2) }), h("span", { text: fmtMs(end) }))),
    h("div", { class: "tree", role: "tree" }, rows),
  );
}

function spanRow(state, span, end, parent) {
  const caret = parent
    ? h("button", {
        class: "caret",
        text: state.collapsed.has(span.span_id) ? "▸" : "▾",
        "aria-label": "collapse",
        onclick: (event) => {
          event.stopPropagation();
          if (state.collapsed.has(span.span_id)) state.collapsed.delete(span.span_id);
          else state.collapsed.add(span.span_id);
          drawTree(state);
        },
      })
    : h("span", { class: "caret-space" });
  const tags = [];
  if (span.agent_name && span.kind !== "agent") tags.push(badge(span.agent_name, "agent"));
  if (span.kind === "agent" && span.agent_name) tags.push(badge(span.agent_name, "agent strong"));
  if (span.model) tags.push(badge(span.model, "model"));
  if (span.input_tokens !== null || span.output_tokens !== null) tags.push(badge(`${span.input_tokens ?? "?"} → ${span.output_tokens ?? "?"} tok`, "tokens"));
  else if (span.prompt_token_ids || span.response_token_ids) tags.push(badge(`${span.prompt_token_ids} → ${span.response_token_ids} ids`, "tokens"));
  if (span.tool_name && span.kind === "tool") tags.push(badge(span.tool_name, "tool"));
  if (span.reward !== null) {
    const el = badge(`reward ${fmtReward(span.reward)}`, "reward");
    Object.assign(el.style, rewardStyle(span.reward, state.range, "badge"));
    tags.push(el);
  }
  if (span.transition) tags.push(badge(`transition #${span.turn_index} · credit ${fmtReward(span.credit)}`, "transition"));
  else if (span.kind === "llm" && span.twin_of) tags.push(badge("twin (merged)", "muted-badge"));
  else if (span.kind === "llm" && span.turn_index !== null) tags.push(badge(span.selected ? "no reward: not trained" : "agent not trained", "muted-badge"));
  if (span.status === "ERROR") tags.push(badge("error", "error"));
  if (span.orphan) tags.push(badge("parent missing", "warn"));
  const left = (span.start_ms / end) * 100;
  const width = span.duration_ms === null ? 0 : (span.duration_ms / end) * 100;
  const bar = h("div", { class: `bar bar-${span.kind}${span.transition ? " bar-transition" : ""}`, style: { left: `${left}%`, width: `max(3px, ${width}%)` } });
  // The duration goes right of the bar, inside it when the bar reaches the right edge, else left of it.
  const text = fmtMs(span.duration_ms);
  let label;
  if (left + width <= 85) label = h("span", { class: "bar-label", text, style: { left: `calc(${left + width}% + 6px)` } });
  else if (width >= 15) label = h("span", { class: "bar-label inside", text, style: { right: `calc(${100 - left - width}% + 6px)` } });
  else label = h("span", { class: "bar-label", text, style: { right: `calc(${100 - left}% + 6px)` } });
  return h(
    "div",
    {
      class: `span-row kind-${span.kind}${state.selected === span.span_id ? " selected" : ""}`,
      role: "treeitem",
      "data-span": span.span_id,
      "data-name": span.name,
      onclick: () => {
        state.selected = state.selected === span.span_id ? null : span.span_id;
        drawTree(state);
      },
    },
    h("div", { class: "span-label", style: { paddingLeft: `${span.depth * 18 + 4}px` } }, caret, h("span", { class: `kind kind-${span.kind}`, text: KIND_LABEL[span.kind] }), h("span", { class: "span-name", text: span.name, title: span.name }), tags),
    h("div", { class: "timeline" }, bar, label),
  );
}

function spanDetail(span) {
  const parts = [];
  if (span.system) parts.push(h("h3", { text: "System instructions" }), message({ role: "system", content: span.system, tool_calls: [] }));
  if (span.input_messages.length) parts.push(h("h3", { text: "Input messages" }), span.input_messages.map(message));
  if (span.output_messages.length) parts.push(h("h3", { text: "Output" }), span.output_messages.map(message));
  if (span.tool_arguments !== null) parts.push(h("h3", { text: "Tool arguments" }), h("pre", { text: pretty(span.tool_arguments) }));
  if (span.tool_result !== null) parts.push(h("h3", { text: "Tool result" }), h("pre", { text: pretty(span.tool_result) }));
  if (Object.keys(span.reward_dimensions).length) {
    parts.push(h("h3", { text: "Reward dimensions" }), kv(span.reward_dimensions));
  }
  const facts = {
    span_id: span.span_id,
    parent_id: span.parent_id ?? "—",
    sequence_id: span.sequence_id,
    start: `+${fmtMs(span.start_ms)}`,
    duration: fmtMs(span.duration_ms),
    status: span.status_message ? `${span.status}: ${span.status_message}` : span.status,
  };
  if (span.turn_index !== null) facts.turn_index = span.turn_index;
  if (span.transition) facts.credited_reward = fmtReward(span.credit);
  parts.push(h("h3", { text: "Span" }), kv(facts));
  if (Object.keys(span.attributes).length) parts.push(h("h3", { text: "Attributes" }), kv(span.attributes));
  if (span.events.length) parts.push(h("h3", { text: "Events" }), span.events.map((e) => h("div", { class: "event" }, h("b", { text: e.name }), ` at +${fmtMs(e.at_ms)} `, h("code", { text: JSON.stringify(e.attributes) }))));
  return h("div", { class: "span-detail", onclick: (event) => event.stopPropagation() }, parts);
}

function message(m) {
  const calls = (m.tool_calls || []).map((c) => {
    const fn = c.function || {};
    return h("div", { class: "tool-call" }, h("b", { text: `→ ${fn.name || c.name || "tool"}` }), " ", h("code", { text: fn.arguments || JSON.stringify(c) }));
  });
  return h(
    "div",
    { class: `msg msg-${m.role}` },
    h("div", { class: "msg-role", text: m.tool_call_id ? `${m.role} · ${m.tool_call_id}` : m.role }),
    m.content ? h("div", { class: "msg-content", text: m.content }) : null,
    calls,
  );
}

function kv(object) {
  return h(
    "table",
    { class: "kv" },
    Object.entries(object).map(([k, v]) => h("tr", {}, h("th", { text: k }), h("td", { text: typeof v === "string" ? v : JSON.stringify(v) }))),
  );
}
