// Whose memory or knowledge: a scope, with the session or agent it needs. Shared by the
// memory and knowledge views.

import { get, query } from "./api.js";
import { h } from "./dom.js";

export const SCOPES = [
  ["user", "Mine (all my sessions)"],
  ["session", "One session"],
  ["agent", "An agent's (shared)"],
  ["tenant", "Everyone's (tenant)"],
];

/** A fieldset of selects; `onChange()` fires when the choice is complete. */
export async function scopePicker({ signal, app, onChange, scopes = SCOPES }) {
  const scope = h(
    "select",
    { name: "scope", "aria-label": "Scope" },
    scopes.map(([v, t]) => h("option", { value: v }, t)),
  );
  const session = h("select", { name: "session_id", "aria-label": "Session" });
  const agent = h(
    "select",
    { name: "agent", "aria-label": "Agent" },
    app.agents.map((a) => h("option", { value: a.name }, a.name)),
  );
  const sessionLabel = h("label", { hidden: true }, "Session", session);
  const agentLabel = h("label", { hidden: true }, "Agent", agent);
  let sessionsLoaded = false;

  async function changed() {
    sessionLabel.hidden = scope.value !== "session";
    agentLabel.hidden = scope.value !== "agent";
    if (scope.value === "session" && !sessionsLoaded) {
      sessionsLoaded = true;
      const page = await get(`/v1/sessions${query({ order: "newest", limit: 200 })}`, { signal });
      session.replaceChildren(
        ...page.data.map((s) => h("option", { value: s.session_id }, s.session_id)),
      );
    }
    if (scope.value === "session" && !session.value) return; // no session to pick yet
    onChange();
  }
  for (const el of [scope, session, agent]) el.addEventListener("change", changed);
  const el = h(
    "fieldset",
    { class: "scope-picker" },
    h("legend", {}, "Whose"),
    h("label", {}, "Scope", scope),
    sessionLabel,
    agentLabel,
  );
  return {
    el,
    /** {scope, session_id?, agent?} for query strings and bodies. */
    value() {
      const out = { scope: scope.value };
      if (scope.value === "session") out.session_id = session.value;
      if (scope.value === "agent") out.agent = agent.value;
      return out;
    },
  };
}
