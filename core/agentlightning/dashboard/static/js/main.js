// The dashboard shell: hash router, authenticated fetch, header statistics and the refresh loop.
import { h, replace } from "./dom.js";
import * as curves from "./curves.js";
import * as detail from "./detail.js";
import * as resources from "./resources.js";
import * as rollouts from "./rollouts.js";
import * as training from "./training.js";
import * as workers from "./workers.js";

const TOKEN_KEY = "agentlightning.token";
let refreshMs = 2000;

const ROUTES = [
  { pattern: /^\/rollouts\/([^/]+)$/, page: "rollouts", view: detail },
  { pattern: /^\/rollouts$/, page: "rollouts", view: rollouts },
  { pattern: /^\/curves$/, page: "curves", view: curves },
  { pattern: /^\/training$/, page: "training", view: training },
  { pattern: /^\/resources$/, page: "resources", view: resources },
  { pattern: /^\/workers$/, page: "workers", view: workers },
];

/** Raised when the store answers with an error status. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
  }
}

/** GET a JSON endpoint of the store, with the bearer token when the user gave one. */
export async function api(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(key, String(value));
  }
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const url = query.size ? `${path}?${query}` : path;
  const response = await fetch(url, { headers, cache: "no-store" });
  if (!response.ok) {
    let detailText = response.statusText;
    try {
      detailText = (await response.json()).detail || detailText;
    } catch {
      // not JSON: keep the status text
    }
    throw new ApiError(response.status, detailText);
  }
  return response.json();
}

/** Change some query parameters of the current route (filters, paging); empty values remove a parameter.

Reads the hash at call time, not a copy taken at render time: a control drawn before the last change must not
bring back a filter the user has just cleared. */
export function updateQuery(changes) {
  const [path, search] = location.hash.slice(1).split("?");
  const query = new URLSearchParams(search || "");
  for (const [key, value] of Object.entries(changes)) {
    if (value === undefined || value === null || value === "") query.delete(key);
    else query.set(key, String(value));
  }
  location.hash = query.size ? `${path}?${query}` : path;
}

let current = null; // {view, state, key}
let timer = null;
let generation = 0;

function parseHash() {
  const raw = location.hash.slice(1) || "/rollouts";
  const [path, search] = raw.split("?");
  return { path, query: new URLSearchParams(search || "") };
}

async function route() {
  const { path, query } = parseHash();
  const match = ROUTES.map((r) => ({ r, m: r.pattern.exec(path) })).find((x) => x.m);
  if (!match) {
    location.hash = "#/rollouts";
    return;
  }
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === match.r.page);
  }
  const container = document.getElementById("view");
  const key = `${path}`;
  if (!current || current.key !== key || current.view !== match.r.view) {
    replace(container);
    current = { view: match.r.view, key, state: match.r.view.mount(container, match.m.slice(1).map(decodeURIComponent)) };
  }
  current.query = query;
  await tick(true);
}

async function tick(immediate = false) {
  clearTimeout(timer);
  const mine = ++generation;
  if (current && (immediate || !document.hidden)) {
    try {
      await Promise.all([current.view.refresh(current.state, current.query), refreshStats()]);
      setLive(true, `live · updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
        askForToken(error);
        return;
      }
      setLive(false, `offline · ${error.message}`);
    }
  }
  if (mine === generation) timer = setTimeout(() => tick(), refreshMs);
}

async function refreshStats() {
  const stats = await api("/v1/statistics");
  const by = stats.rollouts_by_status || {};
  const chip = (label, value, kind) => h("span", { class: `chip ${kind || ""}` }, h("b", { text: value }), ` ${label}`);
  replace(
    document.getElementById("stats"),
    chip("rollouts", stats.total_rollouts),
    chip("running", (by.running || 0) + (by.preparing || 0), "chip-running"),
    chip("queued", (by.queuing || 0) + (by.requeuing || 0), "chip-queued"),
    chip("failed", by.failed || 0, "chip-failed"),
    chip("spans", stats.total_spans),
  );
}

function setLive(ok, text) {
  const el = document.getElementById("live");
  el.textContent = text;
  el.classList.toggle("offline", !ok);
}

function askForToken(error) {
  current = null;
  const input = h("input", { type: "password", placeholder: "bearer token", autocomplete: "off", id: "token-input" });
  const form = h(
    "form",
    {
      class: "card token-form",
      onsubmit: (event) => {
        event.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        route();
      },
    },
    h("h2", { text: "This store requires a token" }),
    h("p", { class: "muted", text: `${error.message}. The token is kept in this tab only (session storage).` }),
    h("div", { class: "row" }, input, h("button", { type: "submit", text: "Open dashboard" })),
  );
  replace(document.getElementById("view"), form);
  setLive(false, "waiting for a token");
  input.focus();
}

/** Set the refresh interval from the server's answer (each JSON view carries refresh_s). */
export function setRefresh(seconds) {
  if (seconds > 0) {
    refreshMs = seconds * 1000;
    document.getElementById("refresh").textContent = String(seconds);
  }
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) tick(true);
});
window.addEventListener("hashchange", route);
route();
