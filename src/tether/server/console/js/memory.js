// Memory by scope: browse, add, edit (guarded by the item's revision), delete, clear.

import { ApiError, api, get, path, query } from "./api.js";
import { add, confirmDialog, fill, h, report as tell, toast, when } from "./dom.js";
import { scopePicker } from "./scope.js";

const KINDS = ["fact", "preference", "rule", "note"];
const AUTHORS = { auto: "automatic note", model: "remembered by the model" };

export async function memoryView(main, _params, { signal, app }) {
  const list = h("ul", { class: "memory-list", "aria-label": "Memory items" });
  // Automatic notes go to the session they were said in (unless an agent keeps them for the
  // user), so "Mine" may be empty while a chat says it remembered something: say where to look.
  const empty = h(
    "p",
    { class: "muted", hidden: true },
    "Nothing remembered here. Automatic notes are kept with the session they were said in: " +
      "choose “One session” to see a session's.",
  );
  const more = h("button", { type: "button", hidden: true }, "Load more");
  let cursor = null;

  const picker = await scopePicker({ signal, app, onChange: () => load(true).catch(report) });

  let generation = 0;
  async function load(reset) {
    // Only the latest load draws: an earlier one that answers later is dropped.
    const mine = ++generation;
    const page = await get(
      `/v1/memory${query({ ...picker.value(), limit: 50, cursor: reset ? null : cursor })}`,
      { signal },
    );
    if (mine !== generation) return;
    if (reset) list.replaceChildren();
    for (const item of page.data) list.append(new MemoryItem(item).el);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    empty.hidden = list.children.length > 0;
  }
  more.addEventListener("click", () => load(false).catch(report));

  const content = h("textarea", {
    name: "content",
    rows: 2,
    "aria-label": "New memory",
    required: true,
  });
  const kind = h(
    "select",
    { name: "kind", "aria-label": "Kind" },
    KINDS.map((k) => h("option", { value: k }, k)),
  );
  const addForm = h(
    "form",
    {
      class: "card",
      "aria-label": "Add a memory",
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          const item = await api("POST", "/v1/memory", {
            body: { content: content.value, kind: kind.value, ...picker.value() },
          });
          list.prepend(new MemoryItem(item).el);
          empty.hidden = true;
          content.value = "";
        } catch (error) {
          report(error);
        }
      },
    },
    h("h2", {}, "Remember something"),
    content,
    h(
      "div",
      { class: "row" },
      h("label", { class: "inline" }, "Kind", kind),
      h("button", { type: "submit" }, "Add memory"),
    ),
  );

  const clearAll = h("button", { type: "button", class: "danger" }, "Clear this scope");
  clearAll.addEventListener("click", async () => {
    const target = picker.value();
    const yes = await confirmDialog({
      title: "Clear this scope?",
      message: `Every memory item of scope “${target.scope}”${target.session_id ? ` in session ${target.session_id}` : ""}${target.agent ? ` of agent ${target.agent}` : ""} is deleted.`,
      confirm: "Clear",
    });
    if (!yes) return;
    try {
      const done = await api("DELETE", `/v1/memory${query(target)}`);
      toast(`Deleted ${done.deleted} items.`);
      await load(true);
    } catch (error) {
      report(error);
    }
  });

  add(
    main,
    h("h1", {}, "Memory"),
    h("div", { class: "toolbar" }, picker.el, clearAll),
    addForm,
    h("section", { "aria-label": "Remembered" }, list, empty, more),
  );
  await load(true);
}

function report(error) {
  tell(error, error.status === 403 ? "Only admins may change agent and tenant memory." : null);
}

/** One item: its text, kind, revision and author; edit and delete. */
class MemoryItem {
  constructor(item) {
    this.item = item;
    this.el = h("li", { class: "memory-item", "aria-label": `Memory ${item.id}` });
    this.draw();
  }

  draw() {
    const it = this.item;
    const author = AUTHORS[it.provenance?.author];
    fill(
      this.el,
      h("p", { class: "content" }, it.content),
      h(
        "p",
        { class: "meta" },
        author ? h("span", { class: "badge auto" }, author) : null,
        h("span", {}, it.kind),
        h("span", {}, `revision ${it.revision}`),
        h("span", {}, `updated ${when(it.updated_at)}`),
        it.provenance?.session_id
          ? h("span", {}, `from session ${it.provenance.session_id}`)
          : null,
      ),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", onclick: () => this.edit(it.content) }, "Edit"),
        h("button", { type: "button", class: "danger", onclick: () => this.remove() }, "Delete"),
      ),
    );
  }

  edit(text, conflict = null) {
    const area = h("textarea", {
      name: "content",
      rows: 3,
      "aria-label": "Edit memory",
      value: text,
    });
    const form = h(
      "form",
      {
        class: "edit",
        onsubmit: (event) => {
          event.preventDefault();
          this.save(area.value, this.item.revision);
        },
      },
      conflict,
      area,
      h(
        "div",
        { class: "actions" },
        h("button", { type: "submit" }, conflict ? "Save mine over it" : "Save"),
        h(
          "button",
          { type: "button", onclick: () => this.draw() },
          conflict ? "Keep theirs" : "Cancel",
        ),
      ),
    );
    this.el.replaceChildren(form);
    area.focus();
  }

  async save(text, revision) {
    try {
      this.item = await api("PATCH", path`/v1/memory/${this.item.id}`, {
        body: { content: text, expected_revision: revision },
      });
      this.draw();
    } catch (error) {
      if (error instanceof ApiError && error.status === 409) {
        await this.conflict(text);
      } else if (error.status === 404) {
        this.el.replaceChildren(h("p", { role: "alert" }, "This memory was deleted elsewhere."));
      } else {
        report(error);
      }
    }
  }

  /** Someone changed the item since we read it: show their text beside ours, let the user pick. */
  async conflict(mine) {
    let newer;
    try {
      newer = await get(path`/v1/memory/${this.item.id}`);
    } catch (error) {
      if (error.status === 404)
        this.el.replaceChildren(h("p", { role: "alert" }, "This memory was deleted elsewhere."));
      else report(error);
      return;
    }
    this.item = newer;
    const box = h(
      "div",
      { class: "conflict", role: "alert" },
      h(
        "p",
        {},
        `Changed elsewhere while you edited it (now revision ${newer.revision}). The newer text:`,
      ),
      h("blockquote", {}, newer.content),
      h("p", {}, "Your edit is below: save it over theirs, or keep theirs."),
    );
    this.edit(mine, box);
  }

  async remove() {
    const yes = await confirmDialog({
      title: "Delete this memory?",
      message: this.item.content,
      confirm: "Delete",
    });
    if (!yes) return;
    try {
      await api("DELETE", path`/v1/memory/${this.item.id}`);
      this.el.remove();
    } catch (error) {
      if (error.status === 404) this.el.remove();
      else report(error);
    }
  }
}
