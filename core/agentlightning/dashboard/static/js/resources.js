// Resources history: every snapshot newest first, prompt templates with diffs, LLM endpoints with weights versions.
import { api, setRefresh } from "./main.js";
import { badge, empty, fmtTime, h, replace, shortId } from "./dom.js";

/** Build the page skeleton. */
export function mount(container) {
  const notice = h("div");
  const list = h("div", { class: "versions" });
  container.append(h("div", { class: "page-head" }, h("h1", { text: "Resources" }), h("span", { class: "muted", text: "Immutable snapshots the runners run with; a new snapshot is published after each update." })), notice, list);
  return { notice, list, last: "" };
}

/** Fetch the history and redraw when it changed. */
export async function refresh(state) {
  const data = await api("/v1/dashboard/resources");
  setRefresh(data.refresh_s);
  const fingerprint = JSON.stringify([data.versions, data.unread]);
  if (fingerprint === state.last) return;
  state.last = fingerprint;
  replace(state.notice, data.unread ? h("div", { class: "notice partial", text: `Counting: ${data.unread} rollouts are not read yet; the counts grow over the next refreshes.` }) : null);
  replace(state.list, data.versions.length ? data.versions.map(version) : empty("No resources published yet."));
}

function version(v, index, all) {
  const first = index === all.length - 1; // newest first: the last card is the first snapshot
  const changes = first
    ? h("div", { class: "changes muted", text: "First snapshot." })
    : h("div", { class: "changes" }, h("b", { text: `Changed since v${all[index + 1].version}: ` }), v.changed.length || v.removed.length ? [...v.changed, ...v.removed.map((n) => `${n} (removed)`)].join(", ") : h("span", { class: "muted", text: "nothing (republished as is)" }));
  return h(
    "section",
    { class: "card version", "data-version": v.version },
    h(
      "div",
      { class: "version-head" },
      h("span", { class: "version-number", text: `v${v.version}` }),
      shortId(v.resources_id, 16),
      h("span", { class: "muted", text: fmtTime(v.create_ms) }),
      h("span", { class: "muted rollout-count", "data-rollouts": v.rollouts, text: `· ${v.rollouts} rollout${v.rollouts === 1 ? "" : "s"}` }),
      v.removed.length ? badge(`removed: ${v.removed.join(", ")}`, "warn") : null,
    ),
    changes,
    v.items.map(item),
  );
}

function item(r) {
  const state = r.added ? badge("new", "new") : r.changed ? badge("changed", "changed") : badge("unchanged", "muted-badge");
  if (r.kind === "prompt_template") {
    return h(
      "div",
      { class: "resource" },
      h("div", { class: "resource-head" }, h("b", { text: r.name }), badge(`prompt · ${r.engine}`, "kind-prompt"), state),
      fieldChanges(r),
      r.diff.length ? h("pre", { class: "diff" }, r.diff.map(diffLine)) : h("pre", { class: "template", text: r.template }),
    );
  }
  const facts = [
    ["model", r.model],
    ["weights version", r.weights_version ?? "—"],
    ["base url", r.base_url],
  ];
  if (Object.keys(r.sampling).length) facts.push(["sampling", JSON.stringify(r.sampling)]);
  return h(
    "div",
    { class: "resource" },
    h("div", { class: "resource-head" }, h("b", { text: r.name }), badge("LLM", "kind-llm"), state, r.weights_version !== null ? badge(`weights v${r.weights_version}`, "weights") : null),
    fieldChanges(r),
    h("table", { class: "kv" }, facts.map(([k, v]) => h("tr", {}, h("th", { text: k }), h("td", { class: "mono", text: String(v) })))),
  );
}

/** What changed in the resource's fields since the previous snapshot: "weights_version: 0 → 1". */
function fieldChanges(r) {
  if (!r.field_changes.length) return null;
  return h(
    "div",
    { class: "field-changes" },
    r.field_changes.map((c) => h("div", { class: "field-change", "data-field": c.field }, h("span", { class: "diff-del", text: `-${c.field}: ${c.before}` }), h("span", { class: "diff-add", text: `+${c.field}: ${c.after}` }))),
  );
}

function diffLine(line) {
  const kind = line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "ctx";
  return h("span", { class: `diff-${kind}`, text: `${line}\n` });
}
