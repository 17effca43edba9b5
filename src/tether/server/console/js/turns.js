// A session's turns for debugging a run: status, reason, timings, usage, and each turn's raw
// event stream (what an SSE client of the API receives, frame by frame).

import { get } from "./api.js";
import { add, h, seconds, when } from "./dom.js";
import { loadSession, notFound } from "./sessions.js";
import { followTurn } from "./sse.js";
import { allTurns } from "./turn.js";

export async function turnsView(main, { sid }, { signal }) {
  const session = await loadSession(sid, signal);
  if (!session) return notFound(main, sid);
  const turns = await allTurns(get, sid, signal);
  const back = `#/sessions/${encodeURIComponent(sid)}`;
  add(
    main,
    h(
      "p",
      { class: "crumbs" },
      h("a", { href: "#/" }, "Sessions"),
      " / ",
      h("a", { href: back }, sid),
      " / ",
    ),
    h("h1", {}, `Turns of ${sid}`),
    turns.length ? null : h("p", { class: "muted" }, "No turns yet."),
    h(
      "ol",
      { class: "turn-list", "aria-label": "Turns" },
      turns.reverse().map((t) => turnRow(sid, t, signal)),
    ),
  );
}

function turnRow(sid, t, signal) {
  const events = h("ol", { class: "events", "aria-label": `Events of turn ${t.seq}` });
  const load = h("button", { type: "button" }, "Show events");
  load.addEventListener("click", async () => {
    load.disabled = true;
    events.replaceChildren();
    try {
      await followTurn(sid, t.id, {
        signal,
        onEvent: (type, data, seq) =>
          events.append(
            h(
              "li",
              {},
              h("span", { class: "seq" }, `${seq}`),
              " ",
              h("strong", {}, type),
              h("pre", {}, JSON.stringify(data, null, 2)),
            ),
          ),
      });
    } finally {
      load.disabled = false;
      load.textContent = "Reload events";
    }
  });
  const u = t.usage || {};
  const facts = [
    ["status", t.status],
    ["reason", t.reason || "—"],
    ["agent", t.ran_by && t.ran_by !== t.agent ? `${t.agent} → ${t.ran_by}` : t.agent || "—"],
    ["policy", t.policy],
    ["created", when(t.created_at)],
    ["waited", seconds(t.created_at, t.started_at)],
    ["ran", seconds(t.started_at, t.ended_at)],
    ["tokens in / out", `${u.input_tokens ?? 0} / ${u.output_tokens ?? 0}`],
    ["model calls", u.model_calls ?? 0],
  ];
  return h(
    "li",
    { class: "turn-row", "data-status": t.status },
    h(
      "details",
      {},
      h(
        "summary",
        {},
        h("span", { class: "seq" }, `#${t.seq}`),
        " ",
        h("span", { class: `status ${t.status}` }, t.status),
        t.reason ? ` ${t.reason}` : "",
        " — ",
        h("span", { class: "input" }, t.input.length > 80 ? `${t.input.slice(0, 80)}…` : t.input),
      ),
      h(
        "dl",
        { class: "facts" },
        facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, String(v)))),
      ),
      t.error ? h("p", { class: "error-text" }, t.error) : null,
      h("p", {}, h("code", {}, t.id)),
      load,
      events,
    ),
  );
}
