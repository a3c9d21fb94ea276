// The rollouts table: status, mode, agents, attempts, reward, duration; filters by status/mode/agent; paging.
import { api, setRefresh, updateQuery } from "./main.js";
import { badge, empty, fmtDuration, fmtReward, fmtTime, h, pill, replace, rewardRange, rewardStyle, shortId } from "./dom.js";

const STATUSES = ["queuing", "preparing", "running", "requeuing", "succeeded", "failed", "cancelled"];
const MODES = ["train", "val", "test"];
const PAGE = 25;

/** Build the page skeleton; refresh() fills it. */
export function mount(container) {
  const filters = h("div", { class: "filters" });
  const table = h("div", { class: "table-wrap" });
  const pager = h("div", { class: "pager" });
  container.append(h("div", { class: "page-head" }, h("h1", { text: "Rollouts" }), filters), table, pager);
  return { filters, table, pager, last: "" };
}

function select(name, label, options, value) {
  const el = h(
    "select",
    { name, "aria-label": label, onchange: () => updateQuery({ [name]: el.value, offset: "" }) },
    h("option", { value: "", text: `${label}: all` }),
    options.map((o) => h("option", { value: o, text: o, selected: o === value })),
  );
  return el;
}

/** Fetch the current page and redraw it when it changed. */
export async function refresh(state, query) {
  const params = {
    status: query.get("status"),
    mode: query.get("mode"),
    agent: query.get("agent"),
    offset: Number(query.get("offset") || 0),
    limit: PAGE,
  };
  const page = await api("/v1/dashboard/rollouts", params);
  setRefresh(page.refresh_s);
  const fingerprint = JSON.stringify([page.rows, page.agents, page.has_more, params]);
  if (fingerprint === state.last) {
    // Durations of running rollouts still move; everything else is unchanged.
    return;
  }
  state.last = fingerprint;
  const agents = [...new Set([...page.agents, ...(params.agent ? [params.agent] : [])])];
  replace(
    state.filters,
    select("status", "Status", STATUSES, params.status),
    select("mode", "Mode", MODES, params.mode),
    select("agent", "Agent", agents, params.agent),
  );
  replace(state.table, page.rows.length ? table(page.rows) : empty("No rollouts match these filters yet."));
  const first = page.rows.length ? params.offset + 1 : 0;
  const last = params.offset + page.rows.length;
  const go = (offset) => updateQuery({ offset: offset || "" });
  replace(
    state.pager,
    h("button", { text: "← Newer", disabled: params.offset === 0, onclick: () => go(Math.max(0, params.offset - PAGE)) }),
    h("span", { class: "muted", text: `rows ${first}–${last}${page.scan_capped ? " (agent search stopped early)" : ""}` }),
    h("button", { text: "Older →", disabled: !page.has_more, onclick: () => go(params.offset + PAGE) }),
  );
}

function table(rows) {
  const range = rewardRange(rows.map((r) => r.reward));
  const head = ["Rollout", "Status", "Mode", "Agents", "Attempts", "Reward", "LLM calls", "Spans", "Duration", "Enqueued", "Worker", "Res."];
  return h(
    "table",
    { class: "grid rollouts" },
    h("thead", {}, h("tr", {}, head.map((t) => h("th", { text: t })))),
    h(
      "tbody",
      {},
      rows.map((r) =>
        h(
          "tr",
          {
            class: "clickable",
            "data-rollout": r.rollout_id,
            onclick: () => {
              location.hash = `#/rollouts/${encodeURIComponent(r.rollout_id)}`;
            },
          },
          h("td", {}, h("a", { href: `#/rollouts/${encodeURIComponent(r.rollout_id)}` }, shortId(r.rollout_id, 14))),
          h("td", {}, pill(r.status)),
          h("td", {}, r.mode ? badge(r.mode, `mode-${r.mode}`) : h("span", { class: "muted", text: "—" })),
          h("td", { class: "agents" }, r.agents.length ? r.agents.map((a) => badge(a, "agent")) : h("span", { class: "muted", text: "—" })),
          h("td", { class: "num", text: r.attempts }),
          h("td", { class: "num reward", text: fmtReward(r.reward), style: rewardStyle(r.reward, range), "data-reward": r.reward }),
          h("td", { class: "num", text: r.llm_calls }),
          h("td", { class: "num", text: r.spans }),
          h("td", { class: "num", text: fmtDuration(r.duration_s) }),
          h("td", { class: "nowrap", text: fmtTime(r.enqueue_ms) }),
          h("td", {}, r.worker_id ? shortId(r.worker_id, 14) : h("span", { class: "muted", text: "—" })),
          h("td", { class: "num", text: r.resources_version === null ? "—" : `v${r.resources_version}` }),
        ),
      ),
    ),
  );
}
