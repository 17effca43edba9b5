// Decision cards: a tool approval (Approve / Deny / Always) or an ask_user question (its
// choices as buttons, or an answer box). A card follows the decision wherever it is made:
// here, in another tab, by the SDK — the turn's `decision.made` event updates it.

import { ApiError, api, path } from "./api.js";
import { h, report } from "./dom.js";

const DONE = {
  approved: "Approved",
  denied: "Denied",
  always: "Approved for the rest of the session",
  answered: "Answered",
  expired: "Expired: nobody decided in time, so it was refused",
  cancelled: "Cancelled with its turn",
};

function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return String(json ?? "");
  }
}

export class DecisionCard {
  constructor(sid, decision) {
    this.sid = sid;
    this.decision = decision;
    this.buttons = [];
    const p = decision.payload || {};
    const approval = decision.kind === "approval";
    const label = approval
      ? p.tool
        ? `Approval for tool ${p.tool}`
        : "Approval to go on"
      : "Question";
    this.status = h("p", { class: "decided", role: "status" });
    this.el = h("section", { class: "decision", role: "group", "aria-label": label });
    if (approval && p.tool) {
      this.el.append(
        h("h3", {}, "Run tool ", h("code", {}, p.tool), "?"),
        h("pre", { class: "arguments", "aria-label": "Arguments" }, pretty(p.arguments)),
        this.actions([
          ["Approve", { decision: "approve" }],
          ["Deny", { decision: "deny" }],
          ["Always", { decision: "always" }, "Approve this tool for the rest of the session"],
        ]),
      );
    } else if (approval) {
      this.el.append(
        h("h3", {}, p.question || "Go on past the step limit?"),
        this.actions([
          ["Approve", { decision: "approve" }],
          ["Deny", { decision: "deny" }],
        ]),
      );
    } else {
      this.el.append(h("h3", {}, p.question || "The agent asks"), this.questionBox(p.choices));
    }
    this.el.append(this.status);
    if (decision.status && decision.status !== "pending") this.made(decision);
  }

  actions(specs) {
    return h(
      "div",
      { class: "actions" },
      specs.map(([text, body, title]) => this.button(text, body, title)),
    );
  }

  button(text, body, title) {
    const b = h("button", { type: "button", title, onclick: () => this.decide(body) }, text);
    this.buttons.push(b);
    return b;
  }

  questionBox(choices) {
    const decline = this.button("Decline", { decision: "deny" }, "Do not answer");
    if (Array.isArray(choices) && choices.length) {
      return h(
        "div",
        { class: "actions" },
        choices.map((c) => this.button(String(c), { answer: String(c) })),
        decline,
      );
    }
    const input = h("input", { type: "text", name: "answer", "aria-label": "Your answer" });
    const send = h("button", { type: "submit" }, "Send answer");
    this.buttons.push(input, send);
    return h(
      "form",
      {
        class: "actions answer",
        onsubmit: (event) => {
          event.preventDefault();
          if (input.value.trim()) this.decide({ answer: input.value });
        },
      },
      input,
      send,
      decline,
    );
  }

  async decide(body) {
    for (const b of this.buttons) b.disabled = true;
    const d = this.decision;
    try {
      const done = await api("POST", path`/v1/sessions/${this.sid}/turns/${d.turn_id}/decisions`, {
        body: { call_id: d.call_id, ...body },
      });
      this.made(done);
    } catch (error) {
      if (error instanceof ApiError && error.kind === "decision-made" && error.problem.decision) {
        this.made(error.problem.decision); // someone was first: theirs stands
        return;
      }
      for (const b of this.buttons) b.disabled = false;
      report(error);
    }
  }

  /** The decision ended (here or elsewhere): show how, and offer nothing more. */
  made(decision) {
    this.decision = { ...this.decision, ...decision };
    for (const b of this.buttons) b.disabled = true;
    const words = DONE[decision.status] || decision.status;
    const answer =
      decision.status === "answered" && decision.answer != null ? `: ${decision.answer}` : "";
    const by = decision.decided_by ? ` (by ${decision.decided_by})` : "";
    this.status.textContent = `${words}${answer}${by}`;
    this.el.dataset.status = decision.status;
  }

  /** The turn ended with this still pending (cancelled, interrupted): nothing to decide. */
  close() {
    if (this.decision.status === "pending") this.made({ status: "cancelled" });
  }
}
