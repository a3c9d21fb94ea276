// Workers (runners) as seen through the attempts they claimed: state, counts and last heartbeat.
import { api, setRefresh } from "./main.js";
import { empty, fmtAgo, fmtTime, h, replace, shortId } from "./dom.js";

/** Build the page skeleton. */
export function mount(container) {
  const note = h("span", { class: "muted" });
  const table = h("div", { class: "table-wrap" });
  container.append(h("div", { class: "page-head" }, h("h1", { text: "Workers" }), note), table);
  return { note, table };
}

/** Fetch the workers and redraw (heartbeat ages move every refresh). */
export async function refresh(state) {
  const data = await api("/v1/dashboard/workers");
  setRefresh(data.refresh_s);
  state.note.textContent = `From the attempts of the ${data.considered} most recent rollouts; a worker with a live attempt unheard for ${data.silent_after_s} s is silent.`;
  if (!data.workers.length) {
    replace(state.table, empty("No runner has claimed a rollout yet."));
    return;
  }
  const head = ["Worker", "State", "Last heartbeat", "At", "Running", "Succeeded", "Failed", "Attempts", "Current rollouts"];
  replace(
    state.table,
    h(
      "table",
      { class: "grid workers" },
      h("thead", {}, h("tr", {}, head.map((t) => h("th", { text: t })))),
      h(
        "tbody",
        {},
        data.workers.map((w) =>
          h(
            "tr",
            { "data-worker": w.worker_id },
            h("td", { class: "mono", text: w.worker_id }),
            h("td", {}, h("span", { class: `pill pill-${w.state}`, text: w.state })),
            h("td", { class: "nowrap", text: fmtAgo(w.last_heartbeat_ms) }),
            h("td", { class: "nowrap muted", text: fmtTime(w.last_heartbeat_ms) }),
            h("td", { class: "num", text: w.running }),
            h("td", { class: "num", text: w.succeeded }),
            h("td", { class: "num", text: w.failed }),
            h("td", { class: "num", text: w.attempts }),
            h("td", {}, w.current_rollouts.length ? w.current_rollouts.map((id) => h("a", { href: `#/rollouts/${encodeURIComponent(id)}`, class: "id-link" }, shortId(id, 14))) : h("span", { class: "muted", text: "—" })),
          ),
        ),
      ),
    ),
  );
}
