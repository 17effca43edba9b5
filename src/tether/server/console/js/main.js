// The console's entry point: sign-in, the header, and a router over the URL's fragment
// (#/sessions/<id>), so the server serves one page and needs no catch-all route.

import { api, auth } from "./api.js";
import { accountView } from "./account.js";
import { chatView } from "./chat.js";
import { clear, h } from "./dom.js";
import { knowledgeView } from "./knowledge.js";
import { memoryView } from "./memory.js";
import { sessionsView } from "./sessions.js";
import { turnsView } from "./turns.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");

/** What every view may read: how we are signed in, and the server's agents. */
export const app = { mode: null, agents: [], signOut };

let current = null; // the AbortController of the view on screen: aborted when it is left

function routeOf(hash) {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "sessions" && parts[1]) {
    return parts[2] === "turns"
      ? { view: turnsView, params: { sid: parts[1] }, tab: "sessions" }
      : { view: chatView, params: { sid: parts[1] }, tab: "sessions" };
  }
  const views = { memory: memoryView, knowledge: knowledgeView, account: accountView };
  if (views[parts[0]]) return { view: views[parts[0]], params: {}, tab: parts[0] };
  return { view: sessionsView, params: {}, tab: "sessions" };
}

async function render() {
  if (!app.mode) return;
  current?.abort();
  current = new AbortController();
  const { view, params, tab } = routeOf(location.hash);
  for (const link of nav.querySelectorAll("a[data-tab]")) {
    if (link.dataset.tab === tab) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  clear(main);
  const signal = current.signal;
  try {
    await view(main, params, { signal, app });
  } catch (error) {
    if (signal.aborted || error.name === "AbortError") return;
    if (error.status === 401) return; // the sign-in form is on its way
    clear(main).append(
      h("h1", {}, "Something went wrong"),
      h("p", { role: "alert" }, error.message || String(error)),
    );
    // Not an answer of the server: a bug of the console, to be seen (and to fail the tests).
    if (!("status" in error)) window.reportError(error);
  }
}

function showWho() {
  clear(who);
  nav.hidden = false;
  if (app.mode === "local") {
    who.append(h("span", { class: "badge" }, "local mode"));
    return;
  }
  const key = auth.key || "";
  who.append(
    h("span", { class: "badge", title: "the API key this tab uses" }, `key ${key.slice(0, 11)}…`),
    h("button", { type: "button", class: "link", onclick: () => signOut() }, "Sign out"),
  );
}

/** Try the credentials we have: local mode (no key) or the stored key. */
async function start(message) {
  try {
    const agents = await api("GET", "/v1/agents", { quiet401: true });
    app.agents = agents.data;
    app.mode = auth.key ? "key" : "local";
    showWho();
    await render();
  } catch (error) {
    if (error.status === 401) {
      // The server's reason says which: an unknown key, an expired or foreign token...
      const reason = error.message.replace(/\.?$/, ".");
      const refused = auth.key
        ? `The server refused this API key (401 unauthorized): ${reason} ` +
          "Check it, or ask for a new one."
        : null;
      auth.clear();
      signIn(message || refused);
      return;
    }
    clear(main).append(
      h("h1", {}, "The server did not answer"),
      h("p", { role: "alert" }, error.message || String(error)),
      h("button", { type: "button", onclick: () => start() }, "Try again"),
    );
  }
}

function signIn(message) {
  current?.abort();
  app.mode = null;
  nav.hidden = true;
  clear(who);
  const input = h("input", {
    type: "password",
    name: "key",
    autocomplete: "off",
    required: true,
    spellcheck: "false",
  });
  const alert = h("p", { role: "alert", class: "error" }, message || "");
  const form = h(
    "form",
    {
      class: "card narrow",
      "aria-label": "Sign in",
      onsubmit: async (event) => {
        event.preventDefault();
        const key = input.value.trim();
        if (!key) return;
        auth.set(key);
        alert.textContent = "";
        await start();
      },
    },
    h("h1", {}, "Sign in"),
    h(
      "p",
      {},
      "This server needs an API key. Its operator makes one with ",
      h("code", {}, "tether keys create --user NAME"),
      "; a server that takes JWTs takes your identity provider's token here too. ",
      "It stays in this tab only (session storage).",
    ),
    h("label", {}, "API key", input),
    alert,
    h("button", { type: "submit" }, "Sign in"),
  );
  clear(main).append(form);
  input.focus();
}

function signOut() {
  auth.clear();
  signIn("Signed out.");
}

// A 401 from any request: the key was revoked, or the server now wants one.
window.addEventListener("tether:unauthorized", () => {
  if (!app.mode) return;
  auth.clear();
  signIn("The server answered 401 unauthorized: sign in with an API key.");
});
window.addEventListener("hashchange", () => render());
start();
