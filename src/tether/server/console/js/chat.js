// A session's conversation: its turns (each drawn from its events), the composer, Stop, and
// the session's own actions (rename, metadata, clear, delete).

import { api, get, path } from "./api.js";
import { add, confirmDialog, fill, h, relative, report, toast } from "./dom.js";
import { loadSession, notFound, statusBadge, titleOf } from "./sessions.js";
import { TurnView, allTurns } from "./turn.js";

const RECENT = 20; // turns drawn at once; earlier ones on request
const REPLAYS = 4; // ended turns fetched at once (the browser has ~6 connections per server)

// What a message sent while a turn is under way does (the API's `policy`).
const POLICIES = [
  ["enqueue", "enqueue", "answer it after the current turn"],
  ["reject", "reject", "refuse to send it"],
  ["interrupt", "interrupt", "end the current turn (its partial reply is kept), then answer"],
  ["rollback", "rollback", "end the current turn and remove its messages, then answer"],
];

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** A random key per message: a retried submission gets the turn the first one made. */
function idempotencyKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function chatView(main, { sid }, { signal, app }) {
  let session = await loadSession(sid, signal);
  if (!session) return notFound(main, sid);

  const views = []; // TurnViews in order
  let loading = true; // the history is not in yet (a turn sent meanwhile waits to be followed)
  let hidden = 0; // earlier turns not drawn (yet)
  const transcript = h("section", { class: "transcript", "aria-label": "Conversation" });
  const header = h("header", { class: "session-head" });
  const composer = makeComposer();
  add(main, header, transcript, composer.form);
  drawHeader();

  // Live turns are followed one at a time, in order: a queued turn has nothing to show until
  // the one before it ends, and each open stream holds one of the browser's few connections.
  let live = Promise.resolve();
  function follow(view) {
    view.onWait = () => refresh(); // the session now awaits input: its header says so
    live = live
      .then(() => (signal.aborted ? undefined : view.follow(signal, ended)))
      .catch((error) => {
        if (!signal.aborted) report(error);
      });
    composer.update();
  }
  function ended() {
    composer.update();
    refresh();
  }
  const active = () => views.filter((v) => !v.ended);

  async function refresh() {
    const fresh = await loadSession(sid, signal).catch(() => null);
    if (fresh) {
      session = fresh;
      drawHeader();
    }
  }

  // -- history ---------------------------------------------------------------------------
  // The composer is usable while the history loads: a message sent meanwhile draws its turn
  // at once (addTurn), and the history, which may hold that turn already, draws the others.
  // Then every turn stands in the session's order (seq), and live turns are followed in that
  // order too: a queued turn has nothing to show until the one ahead of it ends.
  const loaded = await allTurns(get, sid, signal);
  const drawn = new Set(views.map((v) => v.turn.id));
  const turns = loaded.filter((t) => !drawn.has(t.id));
  const earlier = turns.slice(0, Math.max(0, turns.length - RECENT));
  hidden = earlier.length;
  if (earlier.length) {
    const button = h(
      "button",
      { type: "button", class: "link" },
      `Show ${earlier.length} earlier turns`,
    );
    button.addEventListener("click", () => {
      const older = earlier.map((t) => new TurnView(sid, t));
      button.replaceWith(...older.map((v) => v.el));
      views.unshift(...older);
      hidden = 0;
      replay(older.filter((v) => v.ended));
    });
    transcript.append(button);
  }
  const recent = turns.slice(-RECENT).map((t) => new TurnView(sid, t));
  const sentMeanwhile = views.splice(0);
  views.push(...[...recent, ...sentMeanwhile].sort((a, b) => a.turn.seq - b.turn.seq));
  transcript.append(...views.map((v) => v.el)); // a turn drawn meanwhile moves into its place
  loading = false;
  for (const view of views.filter((v) => !v.ended)) follow(view);
  replay(views.filter((v) => v.ended)).then(() => scrollDown());

  /** A turn new to this page (ours, or sent from elsewhere), drawn once whoever saw it first. */
  function addTurn(turn) {
    if (views.some((v) => v.turn.id === turn.id)) return;
    const view = new TurnView(sid, turn);
    views.push(view);
    transcript.append(view.el);
    if (loading) return composer.update(); // followed (or replayed) in order once the history is in
    if (view.ended) replay([view]);
    else follow(view);
  }

  // Turns sent from elsewhere (another tab, the SDK, `tether chat`) show up here too: while the
  // page is visible, the session is read every few seconds and any newer turns are fetched.
  const poll = setInterval(async () => {
    if (document.hidden || signal.aborted) return;
    await refresh();
    if ((session.turn_count ?? 0) <= views.length + hidden) return;
    const last = Math.max(0, ...views.map((v) => v.turn.seq));
    const newer = await allTurns(get, sid, signal, last || null).catch(() => []);
    for (const turn of newer) addTurn(turn);
  }, 4000);
  signal.addEventListener("abort", () => clearInterval(poll));

  function replay(ended) {
    const queue = [...ended];
    const worker = async () => {
      while (queue.length && !signal.aborted) await queue.shift().follow(signal);
    };
    return Promise.all(Array.from({ length: REPLAYS }, worker)).catch((error) => {
      if (!signal.aborted) report(error);
    });
  }

  function scrollDown() {
    window.scrollTo(0, document.documentElement.scrollHeight);
  }

  // Keep the newest text in view while it streams, unless the user scrolled up to read.
  let pinned = true;
  window.addEventListener(
    "scroll",
    () => {
      const bottom = window.innerHeight + window.scrollY;
      pinned = bottom >= document.documentElement.scrollHeight - 120;
    },
    { passive: true, signal },
  );
  const follower = new MutationObserver(() => {
    if (pinned) scrollDown();
  });
  follower.observe(transcript, { childList: true, subtree: true, characterData: true });
  window.addEventListener("resize", () => pinned && scrollDown(), { signal });
  signal.addEventListener("abort", () => follower.disconnect());

  // -- sending and stopping ----------------------------------------------------------------
  async function send(text, policy, agent) {
    const key = idempotencyKey();
    const body = { input: text, policy, wait: false };
    if (agent) body.agent = agent;
    let turn = null;
    for (let attempt = 0; !turn; attempt++) {
      try {
        turn = await api("POST", path`/v1/sessions/${sid}/turns`, {
          body,
          headers: { "Idempotency-Key": key },
        });
      } catch (error) {
        // No answer at all (a dropped connection): the same key cannot make a second turn.
        if (error instanceof TypeError && attempt < 2) continue;
        throw error;
      }
    }
    addTurn(turn);
    pinned = true;
    scrollDown();
    refresh();
  }

  async function stop() {
    const running = active()[0];
    if (!running) return;
    try {
      await api("POST", path`/v1/sessions/${sid}/turns/${running.turn.id}/cancel`);
    } catch (error) {
      report(error);
    }
  }

  function makeComposer() {
    const input = h("textarea", {
      name: "message",
      rows: 2,
      "aria-label": "Message",
      placeholder: "Message — Enter sends, Shift+Enter for a new line, Esc stops",
    });
    const policy = h(
      "select",
      { name: "policy", "aria-label": "If a turn is under way" },
      POLICIES.map(([value, text, title]) => h("option", { value, title }, `${text}: ${title}`)),
    );
    const agent = h(
      "select",
      { name: "agent", "aria-label": "Agent to answer" },
      h("option", { value: "" }, "the session's agent"),
      app.agents.map((a) => h("option", { value: a.name }, a.name)),
    );
    const sendButton = h("button", { type: "submit" }, "Send");
    const stopButton = h(
      "button",
      { type: "button", class: "danger", disabled: true, onclick: stop },
      "Stop",
    );
    const alert = h("p", { role: "alert", class: "error" });
    const form = h(
      "form",
      {
        class: "composer",
        "aria-label": "Send a message",
        onsubmit: async (event) => {
          event.preventDefault();
          const text = input.value;
          if (!text.trim()) return;
          alert.textContent = "";
          sendButton.disabled = true;
          try {
            await send(text, policy.value, agent.value);
            input.value = "";
          } catch (error) {
            alert.textContent =
              error.status === 409 && error.problem.busy_turn_id
                ? `Not sent: the session is busy with turn ${error.problem.busy_turn_id} (policy “reject”).`
                : `Not sent: ${error.message}`;
          } finally {
            sendButton.disabled = false;
            input.focus();
          }
        },
      },
      input,
      h(
        "div",
        { class: "composer-bar" },
        h("label", { class: "inline" }, h("span", { class: "label-text" }, "If busy"), policy),
        h("label", { class: "inline" }, h("span", { class: "label-text" }, "Agent"), agent),
        h("span", { class: "spacer" }),
        stopButton,
        sendButton,
      ),
      alert,
    );
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    return {
      form,
      update() {
        stopButton.disabled = active().length === 0;
      },
    };
  }

  // Esc stops the reply, wherever the focus is — but not while a dialog is open (Esc closes
  // it), nor while one is typing an answer to a turn's question (Esc there is not "cancel").
  const onKey = (event) => {
    const answering = event.target instanceof Element && event.target.closest(".decision");
    const open = document.querySelector("dialog[open]");
    if (event.key === "Escape" && !open && !answering && active().length) {
      event.preventDefault();
      stop();
    }
  };
  document.addEventListener("keydown", onKey);
  signal.addEventListener("abort", () => document.removeEventListener("keydown", onKey));

  // -- the session's own actions ---------------------------------------------------------
  function drawHeader() {
    const title = titleOf(session);
    const agents =
      Array.isArray(session.agents) && session.agents.length ? session.agents : [session.agent];
    fill(
      header,
      h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Sessions"), " / "),
      h("h1", {}, title || session.session_id),
      title ? h("p", { class: "muted" }, session.session_id) : null,
      h(
        "div",
        { class: "facts-line" },
        statusBadge(session.status),
        h("span", {}, `agents: ${agents.join(", ")}`),
        session.item_count != null ? h("span", {}, plural(session.item_count, "item")) : null,
        session.turn_count != null ? h("span", {}, plural(session.turn_count, "turn")) : null,
        h("span", {}, `expires ${session.expires_at ? relative(session.expires_at) : "never"}`),
      ),
      h(
        "div",
        { class: "actions" },
        h("a", { class: "button", href: `#/sessions/${encodeURIComponent(sid)}/turns` }, "Turns"),
        h("button", { type: "button", onclick: rename }, "Rename"),
        h("button", { type: "button", onclick: editMetadata }, "Metadata"),
        h("button", { type: "button", onclick: clearHistory }, "Clear history"),
        h("button", { type: "button", class: "danger", onclick: remove }, "Delete session"),
      ),
    );
  }

  async function patch(metadata) {
    try {
      session = await api("PATCH", path`/v1/sessions/${sid}`, {
        body: { metadata, expected_revision: session.revision },
      });
      drawHeader();
      return true;
    } catch (error) {
      if (error.status === 409) {
        await refresh();
        toast("The session changed elsewhere meanwhile: look again and retry.", "error");
      } else {
        report(error);
      }
      return false;
    }
  }

  function rename() {
    const input = h("input", {
      name: "title",
      value: titleOf(session) || "",
      "aria-label": "Title",
    });
    const form = h(
      "form",
      {
        class: "inline-form",
        "aria-label": "Rename session",
        onsubmit: async (event) => {
          event.preventDefault();
          const metadata = { ...session.metadata };
          if (input.value.trim()) metadata.title = input.value.trim();
          else delete metadata.title;
          await patch(metadata);
        },
      },
      input,
      h("button", { type: "submit" }, "Save title"),
      h("button", { type: "button", onclick: () => drawHeader() }, "Cancel"),
    );
    header.append(form);
    input.focus();
  }

  function editMetadata() {
    const area = h("textarea", {
      name: "metadata",
      rows: 6,
      "aria-label": "Metadata (JSON)",
      value: JSON.stringify(session.metadata, null, 2),
    });
    const error = h("p", { role: "alert", class: "error" });
    const form = h(
      "form",
      {
        class: "inline-form column",
        "aria-label": "Edit metadata",
        onsubmit: async (event) => {
          event.preventDefault();
          let metadata;
          try {
            metadata = JSON.parse(area.value);
          } catch {
            error.textContent = "That is not JSON.";
            return;
          }
          if (!metadata || typeof metadata !== "object" || Array.isArray(metadata)) {
            error.textContent = "Metadata is a JSON object: { … }.";
            return;
          }
          await patch(metadata);
        },
      },
      area,
      error,
      h(
        "div",
        { class: "actions" },
        h("button", { type: "submit" }, "Save metadata"),
        h("button", { type: "button", onclick: () => drawHeader() }, "Cancel"),
      ),
    );
    header.append(form);
    area.focus();
  }

  async function clearHistory() {
    const yes = await confirmDialog({
      title: "Clear the history?",
      message:
        "Every message and turn of this session is deleted, with the notes its turns kept. The session itself stays.",
      confirm: "Clear history",
    });
    if (!yes) return;
    try {
      await api("DELETE", path`/v1/sessions/${sid}/items`);
      views.length = 0;
      hidden = 0;
      transcript.replaceChildren();
      refresh();
      toast("History cleared.");
    } catch (error) {
      report(
        error,
        error.status === 409 ? "A turn is under way: stop it first, then clear." : null,
      );
    }
  }

  async function remove() {
    const yes = await confirmDialog({
      title: "Delete this session?",
      message: `“${sid}” is deleted with its history, its session memory and documents. This cannot be undone.`,
      confirm: "Delete session",
    });
    if (!yes) return;
    try {
      await api("DELETE", path`/v1/sessions/${sid}`);
      toast(`Session ${sid} deleted.`);
      location.hash = "#/";
    } catch (error) {
      report(error);
    }
  }
}
