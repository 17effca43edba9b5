// Small DOM helpers. Everything the console shows is built with h(): text goes in as text
// nodes, never as HTML, so nothing a model, a tool or another user wrote can inject markup.

/** h("button", {class: "x", onclick: fn, "aria-label": "…"}, "text", child…) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "value") {
      el.value = value; // a textarea has no value attribute
    } else if (name === "class") {
      el.className = value;
    } else if (name in el && typeof value !== "string") {
      el[name] = value; // properties such as value, checked, disabled
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** el.append(...children), skipping null, undefined and false (the native one writes "null"). */
export function add(el, ...children) {
  return append(el, children);
}

export function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace `el`'s children (skipping null, undefined and false, unlike replaceChildren). */
export function fill(el, ...children) {
  return append(clear(el), children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** A modal confirmation; resolves true when confirmed. With `typed`, the confirm button
 * stays disabled until the user types that exact text (for what cannot be undone). */
export function confirmDialog({ title, message, confirm = "Confirm", typed = null }) {
  return new Promise((resolve) => {
    const input = typed
      ? h("input", { type: "text", autocomplete: "off", spellcheck: "false" })
      : null;
    const ok = h("button", { type: "submit", class: "danger", value: "ok" }, confirm);
    const cancel = h("button", { type: "submit", value: "cancel" }, "Cancel");
    const dialog = h(
      "dialog",
      { class: "confirm", "aria-label": title },
      h(
        "form",
        { method: "dialog" },
        h("h2", {}, title),
        h("p", {}, message),
        input ? h("label", {}, `Type “${typed}” to confirm`, input) : null,
        h(
          "div",
          { class: "actions" },
          cancel,
          ok,
        ),
      ),
    );
    if (input) {
      ok.disabled = true;
      input.addEventListener("input", () => {
        ok.disabled = input.value.trim() !== typed;
      });
    }
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(dialog.returnValue === "ok");
    });
    document.body.append(dialog);
    dialog.showModal();
    // Focus on the safe choice: an Enter pressed at once must not delete anything.
    (input || cancel).focus();
  });
}

/** Tell the user what went wrong. A server's answer (an ApiError, with a status) or a lost
 * connection is news for the user only; anything else is a bug of the console, so it is also
 * reported as an uncaught error (the browser's console shows it; the browser tests fail on it). */
export function report(error, message) {
  if (!error || error.name === "AbortError") return;
  toast(message || error.message || String(error), "error");
  const network = error instanceof TypeError && /fetch|network/i.test(error.message);
  if (!("status" in error) && !network) window.reportError(error);
}

/** A short message for a moment (role=status: screen readers hear it too). */
export function toast(message, kind = "info") {
  const box = document.getElementById("toast");
  if (!box) return;
  const item = h("p", { class: `toast ${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

export function when(ts) {
  return ts ? new Date(ts * 1000).toLocaleString() : "—";
}

/** "in 3 h", "5 min ago": for expiry and last activity. */
export function relative(ts) {
  if (!ts) return "never";
  const seconds = ts - Date.now() / 1000;
  const abs = Math.abs(seconds);
  const [value, unit] =
    abs < 60
      ? [abs, "s"]
      : abs < 3600
        ? [abs / 60, "min"]
        : abs < 86400
          ? [abs / 3600, "h"]
          : [abs / 86400, "d"];
  const text = `${Math.round(value)} ${unit}`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

export function seconds(from, to) {
  if (!from || !to) return "—";
  const s = to - from;
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}
