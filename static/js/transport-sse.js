/**
 * The page's SSE transport: POST a message (or a regenerate, or an edit) and read the reply as
 * text/event-stream with fetch + ReadableStream (EventSource cannot POST or send headers), or
 * resume one with GET /api/messages/{id}/stream and a Last-Event-ID header. Stop aborts the fetch and asks the
 * server to cancel (POST /api/messages/{id}/cancel), so the server stops even if it never sees
 * the connection close.
 */

import { ApiError, api, enc } from "./api.js";
import { readSSE } from "./sse.js";
import { ConnectionLost } from "./stream.js";

export class StallError extends ConnectionLost {
  constructor() {
    super("No data (not even a keepalive) for too long.");
    this.name = "StallError";
  }
}

function toEvent(ev) {
  let data;
  try {
    data = JSON.parse(ev.data);
  } catch {
    return null;
  }
  const id = ev.hasId && /^[0-9]+$/.test(ev.id) ? Number(ev.id) : null;
  return { type: ev.event, id, data: data && typeof data === "object" ? data : {} };
}

export class SseTransport {
  constructor({ client = api, stallMs = 45000, params = {} } = {}) {
    this.name = "sse";
    this.stopsByAbort = true;
    this.client = client;
    this.stallMs = stallMs;
    this.params = params; // extra fields for the send body (max_tokens, temperature)
  }

  async *open(request, signal) {
    const inner = new AbortController();
    const onAbort = () => inner.abort(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
    let timer = 0;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => inner.abort(new StallError()), this.stallMs);
    };
    arm();
    try {
      let res;
      const headers = { Accept: "text/event-stream" };
      if (request.kind === "send") {
        res = await this.client.fetchRaw(`/api/conversations/${enc(request.conversationId)}/messages`, {
          method: "POST",
          // After the last message on this page's screen, when it shows one.
          json: { content: request.content, ...(request.parentId && { parent_id: request.parentId }), ...this.params },
          headers,
          signal: inner.signal,
        });
      } else if (request.kind === "edit") {
        res = await this.client.fetchRaw(`/api/messages/${enc(request.messageId)}/edit`, {
          method: "POST",
          json: { content: request.content, ...this.params },
          headers,
          signal: inner.signal,
        });
      } else if (request.kind === "regenerate") {
        res = await this.client.fetchRaw(`/api/messages/${enc(request.messageId)}/regenerate`, {
          method: "POST",
          json: { ...this.params },
          headers,
          signal: inner.signal,
        });
      } else {
        res = await this.client.fetchRaw(`/api/messages/${enc(request.messageId)}/stream`, {
          headers: { ...headers, "Last-Event-ID": String(request.after ?? 0) },
          signal: inner.signal,
          cache: "no-store",
        });
      }
      const type = res.headers.get("content-type") || "";
      if (!type.includes("text/event-stream")) {
        throw new ApiError(502, `Expected an event stream, got ${type || "no content type"}.`);
      }
      if (!res.body) throw new ConnectionLost("The response has no body.");
      for await (const raw of readSSE(res.body, { onChunk: arm })) {
        arm();
        const ev = toEvent(raw);
        if (ev) yield ev;
      }
    } catch (err) {
      if (inner.signal.aborted && inner.signal.reason instanceof StallError) throw inner.signal.reason;
      throw err;
    } finally {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      inner.abort(); // release the connection if the consumer stopped early
    }
  }

  cancel(messageId) {
    return this.client.post(`/api/messages/${enc(messageId)}/cancel`, {});
  }
}
