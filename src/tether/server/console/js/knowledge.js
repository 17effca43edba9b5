// Knowledge collections: upload (drag and drop, a progress bar per file), list, delete, search.

import { api, get, path, query, upload } from "./api.js";
import { add, confirmDialog, fill, h, report as tell, toast, when } from "./dom.js";
import { scopePicker } from "./scope.js";

const COLLECTION = /^[A-Za-z0-9._-]{1,64}$/;
const ACCEPT =
  ".txt,.md,.markdown,.html,.htm,.pdf,text/plain,text/markdown,text/html,application/pdf";

export async function knowledgeView(main, _params, { signal, app }) {
  const collections = h("ul", { class: "collections", "aria-label": "Collections" });
  const name = h("input", {
    name: "collection",
    value: "knowledge",
    "aria-label": "Collection",
    // An HTML pattern is compiled with the v flag, where a bare "-" in a class is an error.
    pattern: "[A-Za-z0-9._\\-]{1,64}",
    required: true,
  });
  const documents = h("tbody");
  const table = h(
    "table",
    { class: "documents", "aria-label": "Documents" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Name", "Type", "Chunks", "Characters", "Added", ""].map((c) =>
          h("th", { scope: "col" }, c),
        ),
      ),
    ),
    documents,
  );
  const none = h("p", { class: "muted" }, "No documents in this collection yet.");
  const uploads = h("ul", { class: "uploads", "aria-label": "Uploads" });
  const picker = await scopePicker({ signal, app, onChange: () => refresh().catch(report) });

  const collection = () => name.value.trim();

  let generation = 0;
  async function refresh() {
    const mine = ++generation; // only the latest refresh draws
    const target = picker.value();
    const listed = await get(`/v1/knowledge${query(target)}`, { signal });
    if (mine !== generation) return;
    fill(
      collections,
      ...listed.data.map((c) =>
        h(
          "li",
          {},
          h(
            "button",
            {
              type: "button",
              class: "link",
              "aria-pressed": String(c.name === collection()),
              onclick: () => {
                name.value = c.name;
                refresh().catch(report);
              },
            },
            c.name,
          ),
          h("span", { class: "muted" }, ` ${c.documents} documents, ${c.chunks} chunks`),
        ),
      ),
    );
    if (!COLLECTION.test(collection())) return;
    const docs = await get(path`/v1/knowledge/${collection()}/documents` + query(target), {
      signal,
    });
    if (mine !== generation) return;
    documents.replaceChildren(...docs.data.map(docRow));
    none.hidden = docs.data.length > 0;
    table.hidden = docs.data.length === 0;
  }

  function docRow(d) {
    const remove = async () => {
      const yes = await confirmDialog({
        title: `Delete ${d.name}?`,
        message: "The document and its chunks are deleted.",
        confirm: "Delete",
      });
      if (!yes) return;
      try {
        await api(
          "DELETE",
          path`/v1/knowledge/${d.collection}/documents/${d.id}` + query(picker.value()),
        );
        await refresh();
      } catch (error) {
        report(error);
      }
    };
    return h(
      "tr",
      {},
      h("td", {}, d.name),
      h("td", {}, d.media_type),
      h("td", {}, String(d.chunks)),
      h("td", {}, String(d.chars)),
      h("td", {}, when(d.created_at)),
      h(
        "td",
        {},
        h(
          "button",
          { type: "button", class: "danger", "aria-label": `Delete ${d.name}`, onclick: remove },
          "Delete",
        ),
      ),
    );
  }

  /** Upload each file on its own, with its own progress bar (sent, then indexed). */
  function send(files) {
    if (!COLLECTION.test(collection())) {
      toast("A collection name is 1-64 of letters, digits and . _ -", "error");
      return;
    }
    for (const file of files) {
      const bar = h("progress", { max: 100, value: 0, "aria-label": `Uploading ${file.name}` });
      const state = h("span", { class: "upload-state" }, "sending…");
      uploads.append(h("li", {}, h("span", { class: "file" }, file.name), bar, state));
      const form = new FormData();
      form.append("file", file, file.name);
      for (const [k, v] of Object.entries(picker.value())) form.append(k, v);
      upload(path`/v1/knowledge/${collection()}/documents`, form, (fraction) => {
        bar.value = Math.round(fraction * 100);
        // Sent: the server now parses, chunks and embeds it before it answers.
        if (fraction >= 1) state.textContent = "indexing…";
      })
        .then((doc) => {
          bar.value = 100;
          state.textContent = `added: ${doc.chunks} chunks`;
          state.classList.add("ok");
          return refresh();
        })
        .catch((error) => {
          state.textContent = `failed: ${error.message}`;
          state.classList.add("error");
        });
    }
  }

  const input = h("input", {
    type: "file",
    multiple: true,
    accept: ACCEPT,
    "aria-label": "Choose files to upload",
  });
  input.addEventListener("change", () => {
    send([...input.files]);
    input.value = "";
  });
  const drop = h(
    "div",
    { class: "drop", role: "region", "aria-label": "Drop files to upload" },
    h("p", {}, "Drop text, Markdown, HTML or PDF files here, or "),
    h("label", { class: "button" }, "choose files", input),
  );
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    send([...(event.dataTransfer?.files || [])]);
  });

  const q = h("input", {
    type: "search",
    name: "query",
    "aria-label": "Search the collection",
    required: true,
  });
  const results = h("ol", { class: "hits", "aria-label": "Search results" });
  const search = h(
    "form",
    {
      class: "card",
      role: "search",
      "aria-label": "Try a search",
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          const target = picker.value();
          const body = { query: q.value, limit: 5 };
          if (target.session_id) body.session_id = target.session_id;
          if (target.agent) body.agent = target.agent;
          const hits = await api("POST", path`/v1/knowledge/${collection()}/search`, { body });
          fill(
            results,
            ...hits.data.map((hit) =>
              h(
                "li",
                {},
                h(
                  "p",
                  { class: "meta" },
                  h("strong", {}, hit.document || "?"),
                  hit.page ? ` page ${hit.page}` : "",
                  hit.heading ? ` — ${hit.heading}` : "",
                  ` · score ${hit.score.toFixed(4)}`,
                ),
                h("p", { class: "content" }, hit.content),
              ),
            ),
          );
          if (!hits.data.length) results.append(h("li", { class: "muted" }, "Nothing found."));
        } catch (error) {
          report(error);
        }
      },
    },
    h("h2", {}, "Try a search"),
    h("div", { class: "row" }, q, h("button", { type: "submit" }, "Search")),
    results,
  );

  name.addEventListener("change", () => refresh().catch(report));
  add(
    main,
    h("h1", {}, "Knowledge"),
    h("div", { class: "toolbar" }, picker.el, h("label", {}, "Collection", name)),
    h("section", { "aria-label": "Your collections" }, h("h2", {}, "Collections"), collections),
    drop,
    uploads,
    h(
      "section",
      { "aria-label": "Documents of the collection" },
      h("h2", {}, "Documents"),
      none,
      table,
    ),
    search,
  );
  await refresh();
}

function report(error) {
  tell(error, error.status === 403 ? "Only admins may change agent and tenant knowledge." : null);
}
