// Who this tab is signed in as, signing out, and "forget me": every piece of the caller's
// data deleted (sessions, history, memory, documents), behind a typed confirmation.

import { api, auth } from "./api.js";
import { add, confirmDialog, h } from "./dom.js";

const PHRASE = "forget me";

export async function accountView(main, _params, { app }) {
  const result = h("p", { role: "status" });
  const forget = async () => {
    const yes = await confirmDialog({
      title: "Forget everything of yours?",
      message:
        "Your sessions with their history, your memory and your knowledge documents are deleted now, for good. Shared agent and tenant memory stays.",
      confirm: "Delete all my data",
      typed: PHRASE,
    });
    if (!yes) return;
    try {
      const done = await api("DELETE", "/v1/users/me/data");
      result.textContent = `Deleted ${done.sessions} sessions, ${done.memory} memory items and ${done.documents} documents.`;
    } catch (error) {
      result.textContent = `Nothing was deleted: ${error.message}`;
    }
  };
  add(
    main,
    h("h1", {}, "Account"),
    h(
      "section",
      { class: "card", "aria-label": "Signed in" },
      h("h2", {}, "Signed in"),
      app.mode === "local"
        ? h(
            "p",
            {},
            "Local mode: this server has no API keys, and serves this machine as the user “local”.",
          )
        : h(
            "p",
            {},
            "With the API key ",
            h("code", {}, `${(auth.key || "").slice(0, 11)}…`),
            ", kept in this tab only.",
          ),
      app.mode === "local"
        ? null
        : h("button", { type: "button", onclick: () => app.signOut() }, "Sign out"),
    ),
    h(
      "section",
      { class: "card danger-zone", "aria-label": "Your data" },
      h("h2", {}, "Your data"),
      h(
        "p",
        {},
        "Delete everything this server keeps of you. Turns under way are cancelled first.",
      ),
      h("button", { type: "button", class: "danger", onclick: forget }, "Forget me"),
      result,
    ),
    h(
      "p",
      {},
      "The HTTP API this console uses is described at ",
      h("a", { href: "/docs" }, "/docs"),
      " and ",
      h("a", { href: "/redoc" }, "/redoc"),
      ".",
    ),
  );
}
