/**
 * The page's WebSocket transport: one same-origin socket (/ws, authenticated by the session
 * cookie) shared by every reply on the page. Sends {"type":"send"|"regenerate"|"edit"|"cancel"|"resume"};
 * receives the same events as SSE as JSON objects {"type","id",...payload}, plus "rejected" and
 * "ping" (the frames: app/domain/chat/frames.py).
 * Each frame that opens a stream (send, regenerate, edit, resume) carries a fresh `client_ref`;
 * the server echoes it on the stream's "start" and on a "rejected" that refuses the frame, so both
 * reach the reply that asked, however many are in flight. After the start, a reply's frames are
 * routed by its message_id.
 * A closed socket fails every reply reading from it with ConnectionLost; the ReplyStream then
 * resumes on a new socket from its last offset.
 * With `events` set (push.js), the socket is also the page's push channel: it sends "subscribe"
 * when it opens, its "event" frames go to `onEvent`, and `onOpen`/`onClose` say when it comes and
 * goes.
 */

import { api, enc } from "./api.js";
import { ConnectionLost, RejectedError } from "./stream.js";

/** An async queue of events for one reply, which can be failed. */
class Channel {
  constructor() {
    this.items = [];
    this.waiter = null;
    this.error = null;
  }
  push(item) {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w.resolve(item);
    } else {
      this.items.push(item);
    }
  }
  fail(err) {
    if (this.error) return;
    this.error = err;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w.reject(err);
    }
  }
  next() {
    if (this.items.length) return Promise.resolve(this.items.shift());
    if (this.error) return Promise.reject(this.error);
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }
}

function abortError(signal) {
  const r = signal.reason;
  if (r instanceof Error) return r;
  const e = new Error("aborted");
  e.name = "AbortError";
  return e;
}

let refCounter = 0;

export class WsTransport {
  constructor({ url, client = api, stallMs = 60000, connectTimeoutMs = 10000, WebSocketImpl, onUnauthorized } = {}) {
    this.onUnauthorized = onUnauthorized;
    this.name = "ws";
    this.stopsByAbort = false;
    this.url = url || `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`;
    this.client = client;
    this.stallMs = stallMs;
    this.connectTimeoutMs = connectTimeoutMs;
    this.WS = WebSocketImpl || globalThis.WebSocket;
    this.ws = null;
    this.connecting = null;
    this.subs = new Map(); // message_id -> Channel
    this.waiting = new Map(); // client_ref -> Channel: frames awaiting their start (or refusal)
    this.watchdog = 0;
    this.events = false; // the page's push channel rides on this socket (push.js)
    this.onEvent = this.onOpen = this.onClose = null;
  }

  /** Open the socket now (the push channel wants it open with or without a reply streaming). */
  connect() {
    return this._connect();
  }

  _arm() {
    clearTimeout(this.watchdog);
    // Nothing for too long (the server pings when idle): the socket is probably dead.
    this.watchdog = setTimeout(() => this.reset(new ConnectionLost("The WebSocket went silent.")), this.stallMs);
  }

  _connect() {
    if (this.ws && this.ws.readyState === 1) return Promise.resolve(this.ws);
    if (this.connecting) return this.connecting;
    this.connecting = new Promise((resolve, reject) => {
      let ws;
      try {
        ws = new this.WS(this.url);
      } catch (e) {
        this.connecting = null;
        reject(new ConnectionLost(`Cannot open the WebSocket: ${e.message}`));
        return;
      }
      const timer = setTimeout(() => {
        ws.close();
        fail(new ConnectionLost("The WebSocket did not open in time."));
      }, this.connectTimeoutMs);
      const fail = (err) => {
        clearTimeout(timer);
        if (this.connecting) {
          this.connecting = null;
          reject(err);
        }
      };
      ws.onopen = () => {
        clearTimeout(timer);
        this.ws = ws;
        this.connecting = null;
        this._arm();
        if (this.events) ws.send(JSON.stringify({ type: "subscribe" }));
        resolve(ws);
        this.onOpen?.();
      };
      ws.onmessage = (e) => {
        if (this.ws === ws) this._arm();
        this._route(e.data);
      };
      ws.onerror = () => fail(new ConnectionLost("The WebSocket failed."));
      ws.onclose = (e) => {
        if (e.code === 4401 && this.onUnauthorized) this.onUnauthorized();
        fail(new ConnectionLost(`The WebSocket closed (${e.code}).`));
        if (this.ws === ws) this._closed(new ConnectionLost(`The WebSocket closed (${e.code}${e.reason ? `: ${e.reason}` : ""}).`));
        if (e.code !== 4401) this.onClose?.();
      };
    });
    return this.connecting;
  }

  _closed(err) {
    clearTimeout(this.watchdog);
    this.ws = null;
    for (const ch of this.subs.values()) ch.fail(err);
    for (const ch of this.waiting.values()) ch.fail(err);
    this.subs.clear();
    this.waiting.clear();
  }

  /** Close the socket and fail every reply on it (they reconnect and resume). */
  reset(err = new ConnectionLost("The connection was reset.")) {
    const ws = this.ws;
    if (ws) {
      this._closed(err);
      try {
        ws.close(4000, "client reset");
      } catch {
        /* already closing */
      }
    }
  }

  _route(raw) {
    let msg;
    try {
      msg = JSON.parse(raw);
    } catch {
      return;
    }
    if (!msg || typeof msg !== "object") return;
    const type = msg.type;
    if (type === "ping") return;
    if (type === "event") {
      this.onEvent?.(msg);
      return;
    }
    const asker = msg.client_ref != null ? this.waiting.get(msg.client_ref) : undefined;
    if (asker && (type === "rejected" || type === "start")) this.waiting.delete(msg.client_ref);
    if (type === "rejected") {
      // No asker: a frame nobody waits on (a cancel, or a reply given up on) was refused.
      if (!asker) return;
      const err = new RejectedError(msg.error || msg.detail);
      if (typeof msg.status === "number") err.status = msg.status;
      asker.fail(err);
      return;
    }
    const id = msg.message_id != null ? String(msg.message_id) : null;
    if (!id) return;
    if (type === "start" && asker) this.subs.set(id, asker);
    const ch = this.subs.get(id);
    if (!ch) return; // a reply nobody on this page reads any more
    ch.push({ type, id: typeof msg.id === "number" ? msg.id : null, data: msg });
    if (type === "final" || type === "error") this.subs.delete(id);
  }

  async *open(request, signal) {
    if (signal.aborted) throw abortError(signal);
    const channel = new Channel();
    const onAbort = () => channel.fail(abortError(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    let messageId = null;
    try {
      let stopWaiting;
      const ws = await Promise.race([
        this._connect(),
        new Promise((_, reject) => {
          stopWaiting = () => reject(abortError(signal));
          signal.addEventListener("abort", stopWaiting, { once: true });
        }),
      ]).finally(() => signal.removeEventListener("abort", stopWaiting));
      const frames = {
        send: () => ({ type: "send", conversation_id: request.conversationId, content: request.content, ...(request.parentId && { parent_id: request.parentId }) }),
        regenerate: () => ({ type: "regenerate", message_id: request.messageId }),
        edit: () => ({ type: "edit", message_id: request.messageId, content: request.content }),
        resume: () => ({ type: "resume", message_id: request.messageId, after: request.after ?? 0 }),
      };
      if (request.kind === "resume") {
        messageId = String(request.messageId);
        this.subs.get(messageId)?.fail(new ConnectionLost("Superseded by a new subscription."));
        this.subs.set(messageId, channel);
      }
      const ref = `c${Date.now().toString(36)}${(refCounter++).toString(36)}`;
      this.waiting.set(ref, channel);
      ws.send(JSON.stringify({ ...frames[request.kind](), client_ref: ref }));
      for (;;) {
        const ev = await channel.next();
        if (ev.type === "start") messageId = String(ev.data.message_id);
        yield ev;
        if (ev.type === "final" || ev.type === "error") return;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      for (const [ref, ch] of this.waiting) if (ch === channel) this.waiting.delete(ref);
      if (messageId && this.subs.get(messageId) === channel) this.subs.delete(messageId);
    }
  }

  cancel(messageId) {
    if (this.ws && this.ws.readyState === 1) {
      this.ws.send(JSON.stringify({ type: "cancel", message_id: messageId }));
      return Promise.resolve(null);
    }
    // No socket: the HTTP endpoint stops it just the same.
    return this.client.post(`/api/messages/${enc(messageId)}/cancel`, {});
  }
}
