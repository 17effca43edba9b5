// The console's only way to the server: the public HTTP API, with the user's own key.
//
// The key lives in sessionStorage: it survives a reload but not the tab, and no other site
// can read it. Every request carries it as `Authorization: Bearer …`; with no key (local
// mode) requests carry no credentials at all and the server decides.

const KEY = "tether.apiKey";

export const auth = {
  get key() {
    return sessionStorage.getItem(KEY);
  },
  set(key) {
    sessionStorage.setItem(KEY, key);
  },
  clear() {
    sessionStorage.removeItem(KEY);
  },
  headers(extra = {}) {
    const headers = new Headers(extra);
    const key = this.key;
    if (key) headers.set("Authorization", `Bearer ${key}`);
    return headers;
  },
};

/** A problem+json answer (RFC 9457) as an error: `status`, `type` (its last word), `detail`,
 * and whatever members the problem adds (`busy_turn_id`, `current_revision`, `decision`…). */
export class ApiError extends Error {
  constructor(status, problem) {
    const detail = problem.detail || problem.title || `HTTP ${status}`;
    super(detail);
    this.status = status;
    this.problem = problem;
    this.kind = String(problem.type || "")
      .split("/")
      .pop();
  }
}

async function problemOf(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    body = { detail: `${response.status} ${response.statusText}` };
  }
  return new ApiError(response.status, body);
}

/** Tells the app that the server wants (other) credentials: it shows the sign-in form. */
function unauthorized(error) {
  window.dispatchEvent(new CustomEvent("tether:unauthorized", { detail: error }));
}

/** JSON in, JSON out; a non-2xx answer throws an ApiError. */
export async function api(method, path, { body, headers, signal, quiet401 = false } = {}) {
  const h = auth.headers(headers);
  let payload;
  if (body !== undefined) {
    h.set("Content-Type", "application/json");
    payload = JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers: h, body: payload, signal });
  if (!response.ok) {
    const error = await problemOf(response);
    if (response.status === 401 && !quiet401) unauthorized(error);
    throw error;
  }
  if (response.status === 204 || response.status === 205) return null;
  return response.json();
}

export const get = (path, opts) => api("GET", path, opts);

/** A path with its segments escaped: session ids may hold ':' and '.'. */
export function path(strings, ...values) {
  return strings.reduce(
    (out, s, i) => out + s + (i < values.length ? encodeURIComponent(values[i]) : ""),
    "",
  );
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(name, value);
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

/** Open a GET whose body is read as a stream (server-sent events): the response itself. */
export async function openStream(url, { headers, signal }) {
  const response = await fetch(url, { headers: auth.headers(headers), signal, cache: "no-store" });
  if (!response.ok && response.status !== 204) {
    const error = await problemOf(response);
    if (response.status === 401) unauthorized(error);
    throw error;
  }
  return response;
}

/** POST a multipart form with upload progress: fetch cannot report how much of a request
 * body was sent, XMLHttpRequest can. Resolves with the JSON answer; rejects with an ApiError. */
export function upload(url, form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url);
    const key = auth.key;
    if (key) xhr.setRequestHeader("Authorization", `Bearer ${key}`);
    xhr.responseType = "json";
    xhr.upload.addEventListener("progress", (e) => {
      if (e.lengthComputable) onProgress(e.loaded / e.total);
    });
    xhr.upload.addEventListener("load", () => onProgress(1));
    xhr.addEventListener("load", () => {
      const body = xhr.response || {};
      if (xhr.status >= 200 && xhr.status < 300) {
        resolve(body);
        return;
      }
      const error = new ApiError(xhr.status, body);
      if (xhr.status === 401) unauthorized(error);
      reject(error);
    });
    xhr.addEventListener("error", () =>
      reject(new ApiError(0, { detail: "the upload did not reach the server" })),
    );
    xhr.send(form);
  });
}
