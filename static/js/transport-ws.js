/**
 * The page's WebSocket transport: one same-origin socket (/ws, authenticated by the session
 * cookie) shared by every reply on the page. Sends {"type":"send"|"regenerate"|"edit"|"cancel"|"resume"};
 * receives the same events as SSE as JSON objects {"type","id",...payload}, plus "rejected" and
 * "ping".
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
    this.pending = []; // sends awaiting their start event: {ref, channel}
    this.resuming = []; // resumes awaiting their start event: {messageId, channel}
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
    for (const p of this.pending) p.channel.fail(err);
    this.subs.clear();
    this.pending = [];
    this.resuming = [];
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
    if (type === "rejected") {
      const err = new RejectedError(msg.error || msg.detail);
      if (typeof msg.status === "number") err.status = msg.status;
      if (msg.client_ref != null) {
        // Sends always carry a client_ref, and the server echoes it even for a refused send.
        const idx = this.pending.findIndex((p) => p.ref === msg.client_ref);
        if (idx !== -1) this.pending.splice(idx, 1)[0].channel.fail(err);
      } else if (this.resuming.length) {
        // resume/cancel frames carry no ref: a refusal goes to the oldest unanswered resume.
        this.resuming.shift().channel.fail(err);
      }
      return;
    }
    const id = msg.message_id != null ? String(msg.message_id) : null;
    if (!id) return;
    let ch = this.subs.get(id);
    if (!ch && type === "start") {
      let idx = this.pending.findIndex((p) => msg.client_ref != null && p.ref === msg.client_ref);
      if (idx === -1 && this.pending.length) idx = 0;
      if (idx !== -1) {
        const [p] = this.pending.splice(idx, 1);
        ch = p.channel;
        this.subs.set(id, ch);
      }
    }
    if (type === "start") this.resuming = this.resuming.filter((r) => r.messageId !== id);
    if (!ch) return; // a reply nobody on this page reads any more
    ch.push({ type, id: typeof msg.id === "number" ? msg.id : null, data: msg });
    if (type === "final" || type === "error") this.subs.delete(id);
  }

  async *open(request, signal) {
    if (signal.aborted) throw abortError(signal);
    const channel = new Channel();
    const onAbort = () => channel.fail(abortError(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    let ref = null;
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
      if (request.kind === "send" || request.kind === "regenerate" || request.kind === "edit") {
        ref = `c${Date.now().toString(36)}${(refCounter++).toString(36)}`;
        this.pending.push({ ref, channel });
        const frames = {
          send: () => ({ type: "send", conversation_id: request.conversationId, content: request.content }),
          regenerate: () => ({ type: "regenerate", message_id: request.messageId }),
          edit: () => ({ type: "edit", message_id: request.messageId, content: request.content }),
        };
        ws.send(JSON.stringify({ ...frames[request.kind](), client_ref: ref }));
      } else {
        messageId = String(request.messageId);
        this.subs.get(messageId)?.fail(new ConnectionLost("Superseded by a new subscription."));
        this.subs.set(messageId, channel);
        this.resuming.push({ messageId, channel });
        ws.send(JSON.stringify({ type: "resume", message_id: request.messageId, after: request.after ?? 0 }));
      }
      for (;;) {
        const ev = await channel.next();
        if (ev.type === "start") messageId = String(ev.data.message_id);
        yield ev;
        if (ev.type === "final" || ev.type === "error") return;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.pending = this.pending.filter((p) => p.channel !== channel);
      this.resuming = this.resuming.filter((r) => r.channel !== channel);
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
