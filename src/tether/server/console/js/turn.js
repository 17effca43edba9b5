// One turn of the conversation, drawn from its event stream: the same code draws a turn as it
// happens, a turn replayed after a reload, and one resumed after a dropped connection, so
// what the page shows is always a fold of the events the server stored — once each.

import { get, path } from "./api.js";
import { DecisionCard } from "./decisions.js";
import { fill, h } from "./dom.js";
import { followTurn } from "./sse.js";

export const ENDED = new Set([
  "completed",
  "cancelled",
  "interrupted",
  "rolled_back",
  "limit_reached",
  "failed",
  "rejected",
]);
const STATUS_WORDS = {
  queued: "queued",
  running: "answering…",
  awaiting_input: "waiting for your decision",
  rolled_back: "rolled back",
  limit_reached: "limit reached",
};

function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return String(json ?? "");
  }
}

export class TurnView {
  constructor(sid, turn) {
    this.sid = sid;
    this.turn = turn;
    this.ended = ENDED.has(turn.status);
    this.last = 0; // the seq of the last event applied
    this.text = null; // the text segment being streamed into
    this.tools = new Map(); // call_id → {status, result}
    this.cards = new Map(); // call_id → DecisionCard
    // The agent that answered: a handoff (in this turn or an earlier one) makes it another
    // than the one the turn was sent to.
    this.agent = turn.ran_by || turn.agent;
    this.onWait = null; // called when the turn starts waiting for a human

    this.who = h("span", { class: "who" }, this.agent || "agent");
    this.recalled = h("details", { class: "recalled", hidden: true });
    this.recalledTexts = []; // [memory id, element] still to fill in
    this.recalled.addEventListener("toggle", () => {
      if (this.recalled.open) this.showRecalledTexts();
    });
    this.steps = h("div", { class: "steps" });
    this.outcome = h("p", { class: "outcome" });
    this.link = h("span", { class: "link-state", role: "status" });
    this.reply = h(
      "div",
      { class: "bubble assistant" },
      h("div", { class: "meta" }, this.who, this.link),
      this.recalled,
      this.steps,
      this.outcome,
    );
    this.el = h(
      "article",
      { class: "turn", "aria-label": `Turn ${turn.seq}`, "data-turn": turn.id },
      h(
        "div",
        { class: "bubble user" },
        h("span", { class: "who" }, "You"),
        h("p", {}, turn.input),
      ),
      this.reply,
    );
    this.showStatus(turn.status, turn.reason, turn.error);
  }

  /** Follow the turn's events (replaying what was stored, then live) until it ends. */
  async follow(signal, onEnded) {
    await followTurn(this.sid, this.turn.id, {
      after: this.last,
      signal,
      onEvent: (type, data, seq) => {
        this.last = seq;
        this.apply(type, data);
        if (type === "turn.ended") onEnded?.(this);
      },
      onLink: (state) => {
        this.link.textContent = state === "reconnecting" ? "connection lost, reconnecting…" : "";
      },
    });
  }

  apply(type, data) {
    switch (type) {
      case "turn.queued":
        return this.showStatus("queued");
      case "turn.started":
      case "turn.resumed":
        return this.showStatus("running");
      case "turn.awaiting_input":
        this.showStatus("awaiting_input");
        return this.onWait?.(this);
      case "message.delta":
        return this.delta(data.text || "");
      case "message.completed":
        return this.completed(data);
      case "tool.call":
        return this.toolCall(data);
      case "tool.started":
        return this.toolState(data.call_id, "running");
      case "tool.result":
        return this.toolResult(data);
      case "decision.requested":
        return this.decisionRequested(data);
      case "decision.made":
        this.cards.get(data.call_id)?.made(data);
        return undefined;
      case "memory.recalled":
        return this.memoryRecalled(data.items || []);
      case "memory.written":
        return this.note("memory", `Remembered (${data.scope}): ${data.content}`);
      case "context.compacted":
        return this.note("compacted", "Earlier history was summarised to fit the model's window.");
      case "handoff":
        return this.handoff(data);
      case "turn.ended":
        return this.end(data);
      default:
        return undefined; // a newer server's event: nothing to draw
    }
  }

  delta(text) {
    if (!this.text) {
      this.text = h("p", { class: "text" });
      this.steps.append(this.text);
    }
    this.text.textContent += text;
  }

  completed({ text, complete }) {
    if (!this.text && text) this.delta("");
    if (this.text) {
      this.text.textContent = text ?? this.text.textContent; // the step's whole text
      if (complete === false) this.markIncomplete(this.text);
    }
    this.text = null;
  }

  markIncomplete(segment) {
    if (segment.classList.contains("incomplete")) return;
    segment.classList.add("incomplete");
    segment.after(h("p", { class: "incomplete-note" }, "incomplete: the reply was cut off"));
  }

  toolCall({ call_id, name, arguments: args }) {
    this.text = null;
    const state = h("span", { class: "tool-state" }, "called");
    const result = h("pre", { class: "tool-result", hidden: true });
    const handoff = name.startsWith("transfer_to_");
    const details = h(
      "details",
      { class: "tool", "data-call": call_id },
      h("summary", {}, handoff ? "Handoff " : "Tool ", h("code", {}, name), " ", state),
      h("p", { class: "label" }, "Arguments"),
      h("pre", {}, pretty(args)),
      h("p", { class: "label", hidden: true }, "Result"),
      result,
    );
    this.tools.set(call_id, { details, state, result });
    this.steps.append(details);
  }

  toolState(callId, words) {
    const tool = this.tools.get(callId);
    if (tool) tool.state.textContent = words;
  }

  toolResult({ call_id, name, output, error }) {
    if (!this.tools.has(call_id)) this.toolCall({ call_id, name: name || "tool", arguments: "" });
    const tool = this.tools.get(call_id);
    tool.state.textContent = error ? "→ error" : "→ done";
    tool.result.hidden = false;
    tool.result.previousElementSibling.hidden = false;
    tool.result.textContent = output ?? "";
    tool.details.classList.toggle("error", Boolean(error));
  }

  decisionRequested(decision) {
    if (this.cards.has(decision.call_id)) return;
    const card = new DecisionCard(this.sid, decision);
    this.cards.set(decision.call_id, card);
    this.text = null;
    this.steps.append(card.el);
    if (decision.status === "pending" && !this.ended)
      card.el.querySelector("button, input")?.focus({ preventScroll: true });
  }

  memoryRecalled(items) {
    const n = items.length;
    this.recalled.hidden = n === 0;
    fill(
      this.recalled,
      h("summary", {}, `used ${n} ${n === 1 ? "memory" : "memories"}`),
      h(
        "ul",
        {},
        items.map((i) => {
          const text = h("span", { class: "recalled-text" });
          const li = h(
            "li",
            {},
            i.collection
              ? `knowledge “${i.collection}”${i.meta?.document ? `, ${i.meta.document}` : ""}`
              : `${i.scope} ${i.kind}`,
            i.meta?.author === "auto" ? " (automatic note)" : "",
            ": ",
            text,
          );
          if (!i.collection) this.recalledTexts.push([i.id, text]);
          return li;
        }),
      ),
    );
  }

  /** The event names what was recalled, never its text (DESIGN §8): the memory items' texts
   * are fetched when the list is first opened, with the user's own key (a deleted one says so). */
  async showRecalledTexts() {
    const wanted = this.recalledTexts.splice(0);
    for (const [id, el] of wanted) {
      try {
        const item = await get(path`/v1/memory/${id}`, { quiet401: true });
        el.textContent = item.content;
      } catch {
        el.textContent = "(no longer in memory)";
      }
    }
  }

  handoff(data) {
    this.text = null;
    this.agent = data.to;
    this.who.textContent = data.to;
    const reason = data.reason ? `: ${data.reason}` : "";
    this.steps.append(
      h("p", { class: "handoff" }, `Handed over from ${data.from} to ${data.to}${reason}`),
    );
  }

  note(kind, text) {
    this.steps.append(h("p", { class: `note ${kind}` }, text));
  }

  end(data) {
    this.ended = true;
    // A completed turn's reply may still be cut short (at the model's output cap).
    const cut = data.status !== "completed" || data.complete === false;
    if (this.text && cut) this.markIncomplete(this.text);
    this.text = null;
    if (data.agent) {
      this.agent = data.agent; // who answered, after any handoff
      this.who.textContent = data.agent;
    }
    for (const card of this.cards.values()) card.close();
    this.turn = {
      ...this.turn,
      status: data.status,
      reason: data.reason,
      error: data.error,
      usage: data.usage,
    };
    this.showStatus(data.status, data.reason, data.error);
  }

  showStatus(status, reason, error) {
    const word = STATUS_WORDS[status] || status;
    this.el.dataset.status = status;
    this.el.classList.toggle("rolled-back", status === "rolled_back");
    const parts = [h("span", { class: `status ${status}` }, word)];
    if (ENDED.has(status) && reason)
      parts.push(" ", h("span", { class: "reason" }, `reason: ${reason}`));
    if (error) parts.push(h("span", { class: "error-text" }, ` — ${error}`));
    if (status === "rolled_back")
      parts.push(h("span", { class: "muted" }, " (its messages were removed from the history)"));
    this.outcome.replaceChildren(...parts);
  }
}

/** Every turn of a session (after the one of seq `after`), oldest first (all pages). */
export async function allTurns(get, sid, signal, after = null) {
  const turns = [];
  let cursor = after;
  do {
    const q = cursor ? `?limit=500&cursor=${cursor}` : "?limit=500";
    const page = await get(path`/v1/sessions/${sid}/turns` + q, { signal });
    turns.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor);
  return turns;
}
