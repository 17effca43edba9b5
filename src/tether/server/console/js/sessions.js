// The caller's sessions: newest first, searchable by id, and a form for a new one.

import { api, get, path, query } from "./api.js";
import { add, h, relative, report, toast } from "./dom.js";

const PAGE = 25;

export const STATUS_LABELS = { idle: "idle", busy: "busy", awaiting_input: "awaiting input" };

export function statusBadge(status) {
  if (!status) return null;
  return h("span", { class: `status ${status}` }, STATUS_LABELS[status] || status);
}

export function titleOf(session) {
  const title = session.metadata?.title;
  return typeof title === "string" && title.trim() ? title : null;
}

export async function sessionsView(main, _params, { signal, app }) {
  const list = h("ul", { class: "sessions", "aria-label": "Sessions" });
  const more = h("button", { type: "button", hidden: true }, "Load more sessions");
  const empty = h("p", { class: "muted", hidden: true }, "No sessions yet: start one above.");
  const search = h("input", {
    type: "search",
    name: "q",
    "aria-label": "Search sessions by id",
    placeholder: "Search by id",
    autocomplete: "off",
  });
  let cursor = null;
  let q = "";

  let generation = 0;
  async function load(reset) {
    // Only the latest load draws: a slower answer to an older search is dropped.
    const mine = ++generation;
    const params = { order: "newest", q, limit: PAGE, cursor: reset ? null : cursor };
    const page = await get(`/v1/sessions${query(params)}`, { signal });
    if (mine !== generation) return;
    if (reset) list.replaceChildren();
    for (const session of page.data) list.append(row(session));
    cursor = page.next_cursor;
    more.hidden = !cursor;
    empty.hidden = list.children.length > 0;
    empty.textContent = q ? `No session id contains “${q}”.` : "No sessions yet: start one above.";
  }

  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      q = search.value.trim();
      load(true).catch(report);
    }, 200);
  });
  more.addEventListener("click", () => {
    load(false).catch(report);
  });

  add(
    main,
    h("h1", {}, "Sessions"),
    newSessionForm(app),
    h(
      "section",
      { "aria-label": "Your sessions" },
      h("div", { class: "toolbar" }, search),
      list,
      empty,
      more,
    ),
  );
  await load(true);
}

function row(s) {
  const title = titleOf(s);
  const agents = Array.isArray(s.agents) && s.agents.length ? s.agents : [s.agent];
  const facts = [
    ["agents", agents.join(", ")],
    s.item_count != null ? ["items", s.item_count] : null,
    s.turn_count != null ? ["turns", s.turn_count] : null,
    ["active", relative(s.updated_at)],
    ["expires", s.expires_at ? relative(s.expires_at) : "never"],
  ].filter(Boolean);
  return h(
    "li",
    { class: "session" },
    h(
      "a",
      { href: `#/sessions/${encodeURIComponent(s.session_id)}`, class: "session-link" },
      h("strong", {}, title || s.session_id),
      title ? h("span", { class: "muted" }, ` ${s.session_id}`) : null,
    ),
    statusBadge(s.status),
    h(
      "dl",
      { class: "facts" },
      facts.map(([name, value]) => h("div", {}, h("dt", {}, name), h("dd", {}, String(value)))),
    ),
  );
}

function newSessionForm(app) {
  const agent = h(
    "select",
    { name: "agent" },
    app.agents.map((a) => h("option", { value: a.name }, a.name)),
  );
  const id = h("input", {
    name: "session_id",
    autocomplete: "off",
    placeholder: "leave empty for a new id",
    pattern: "[A-Za-z0-9._:\\-]{1,128}",
    title: "1-128 of letters, digits and . _ : -",
  });
  const error = h("p", { role: "alert", class: "error" });
  return h(
    "form",
    {
      class: "card new-session",
      "aria-label": "New session",
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = "";
        const body = { agent: agent.value };
        if (id.value.trim()) body.session_id = id.value.trim();
        try {
          const made = await api("POST", "/v1/sessions", { body });
          location.hash = `#/sessions/${encodeURIComponent(made.session_id)}`;
        } catch (e) {
          error.textContent =
            e.status === 409 ? `You already have a session “${body.session_id}”.` : e.message;
        }
      },
    },
    h("h2", {}, "New session"),
    h(
      "div",
      { class: "row" },
      h("label", {}, "Agent", agent),
      h("label", {}, "Session id (optional)", id),
    ),
    error,
    h("button", { type: "submit" }, "Create session"),
  );
}

/** The session, or null when it is unknown or someone else's (the same 404). */
export async function loadSession(sid, signal) {
  try {
    return await get(path`/v1/sessions/${sid}`, { signal });
  } catch (error) {
    if (error.status === 404) return null;
    throw error;
  }
}

export function notFound(main, sid) {
  add(
    main,
    h("h1", {}, "Session not found"),
    h(
      "p",
      { role: "alert" },
      `There is no session “${sid}” of yours: it does not exist, it expired, or it belongs to someone else.`,
    ),
    h("a", { href: "#/" }, "Back to your sessions"),
  );
}
