// Server-sent events over fetch. EventSource cannot send an Authorization header, so the
// console reads the stream itself: frames are split on blank lines and their fields parsed
// as the HTML standard says (`id`, `event`, `data`; lines starting with ':' are comments,
// which is how the server pings).

import { openStream, path } from "./api.js";
import { sleep } from "./dom.js";

/** The frames of an event-stream body, as {id, event, data} (data: the raw text). */
export async function* frames(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = parse(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (frame) yield frame;
      }
    }
  } finally {
    if (!signal?.aborted) reader.cancel().catch(() => {});
  }
}

function parse(block) {
  const frame = { id: null, event: "message", data: [] };
  let seen = false;
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    seen = true;
    if (field === "id") frame.id = value;
    else if (field === "event") frame.event = value;
    else if (field === "data") frame.data.push(value);
  }
  return seen ? { ...frame, data: frame.data.join("\n") } : null;
}

/**
 * Follow one turn's events until its `turn.ended`, surviving drops: after a network error or
 * a stream that ends early (a proxy, a sleeping laptop, a server restart) it reconnects with
 * `Last-Event-ID: <turn>:<seq>` of the last event handled, so the server sends exactly what
 * came after it — nothing lost, nothing twice.
 *
 * `onEvent(type, data, seq)` is called once per event, in order; `onLink(state)` with
 * "live", "reconnecting" or "closed". Resolves when the turn ended or `signal` aborted.
 */
export async function followTurn(sid, tid, { after = 0, onEvent, onLink = () => {}, signal }) {
  let last = after;
  let wait = 250;
  const url = path`/v1/sessions/${sid}/turns/${tid}/events`;
  while (!signal?.aborted) {
    try {
      const headers = last ? { "Last-Event-ID": `${tid}:${last}` } : {};
      const response = await openStream(url, { headers, signal });
      // 204: our last event was the turn's turn.ended itself; nothing more will come.
      if (response.status === 204) break;
      onLink("live");
      for await (const frame of frames(response.body, signal)) {
        const seq = Number(frame.id?.split(":").pop());
        if (!Number.isFinite(seq) || seq <= last) continue; // never apply an event twice
        last = seq;
        wait = 250;
        const data = frame.data ? JSON.parse(frame.data) : {};
        onEvent(frame.event, data, seq);
        if (frame.event === "turn.ended") {
          onLink("closed");
          return last;
        }
      }
    } catch (error) {
      if (signal?.aborted) break;
      // The turn or its session is gone, or the key no longer works: retrying cannot help.
      if (error.status && error.status < 500 && error.status !== 429) {
        onLink("closed");
        throw error;
      }
    }
    if (signal?.aborted) break;
    onLink("reconnecting");
    const woken = new AbortController();
    await Promise.race([sleep(wait, signal), online(woken.signal)]);
    woken.abort();
    wait = Math.min(wait * 2, 5000);
  }
  onLink("closed");
  return last;
}

/** Resolves when the browser says it is back online (a woken laptop): reconnect at once. */
function online(signal) {
  return new Promise((resolve) =>
    window.addEventListener("online", resolve, { once: true, signal }),
  );
}
