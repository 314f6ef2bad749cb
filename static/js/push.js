/**
 * The page's one push channel: the user's events from their other tabs and devices (a reply
 * started or ended, a conversation created, renamed or deleted; app/domain/chat/push_events.py).
 *
 * Over the WebSocket when the page streams over it (the same socket, after a `subscribe` frame:
 * its `event` frames), else over `GET /api/events` (server-sent events read with fetch, as the
 * replies are). Either way it reconnects with backoff, and says so (`onConnected(again)`), since
 * a page that was cut off missed events and must refetch what it shows.
 */

import { api } from "./api.js";
import { backoffDelay } from "./reply.js";
import { readSSE } from "./sse.js";

/** The account was signed out, or the user's newer pages pushed this channel out (past the
 * server's PUSH_MAX_CHANNELS_PER_USER): reconnecting would only push out another. */
function endsTheChannel(ev) {
  return ev.event === "signed_out" || (ev.event === "resync" && ev.reason === "evicted");
}

/** GET /api/events, reconnecting until stopped (or ended for good by the server). */
export class SsePush {
  constructor({ client = api, stallMs = 45000, onEvent, onConnected }) {
    Object.assign(this, { client, stallMs, onEvent, onConnected });
    this.ctl = null;
  }

  start() {
    if (this.ctl) return;
    this.ctl = new AbortController();
    this._loop(this.ctl.signal);
  }

  stop() {
    this.ctl?.abort();
    this.ctl = null;
  }

  async _loop(signal) {
    let attempt = 0;
    while (!signal.aborted) {
      const inner = new AbortController();
      const onAbort = () => inner.abort();
      signal.addEventListener("abort", onAbort, { once: true });
      let timer = 0;
      const arm = () => {
        clearTimeout(timer);
        timer = setTimeout(() => inner.abort(), this.stallMs); // not even a keepalive: dead
      };
      try {
        arm();
        const res = await this.client.fetchRaw("/api/events", {
          headers: { Accept: "text/event-stream" },
          signal: inner.signal,
          cache: "no-store",
        });
        if (!res.body) throw new Error("no body");
        attempt = 0;
        this.onConnected();
        let last = false; // the server ended this channel for good: no reconnecting
        for await (const raw of readSSE(res.body, { onChunk: arm })) {
          let data;
          try {
            data = JSON.parse(raw.data);
          } catch {
            continue;
          }
          if (!data || typeof data !== "object") continue;
          const ev = { ...data, event: raw.event || data.event };
          last ||= endsTheChannel(ev);
          this.onEvent(ev);
        }
        if (last) return;
      } catch (err) {
        if (err?.status === 401) return; // logged out: api.js already goes to the log-in page
      } finally {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        inner.abort();
      }
      if (signal.aborted) return;
      await new Promise((resolve) => setTimeout(resolve, backoffDelay(++attempt)));
    }
  }
}

/** The page's WebSocket (transport-ws.js), kept open for its `event` frames. */
class WsPush {
  constructor({ transport, onEvent, onConnected }) {
    Object.assign(this, { transport, onEvent, onConnected });
    this.active = false;
    this.timer = 0;
    this.attempt = 0;
  }

  start() {
    if (this.active) return;
    this.active = true;
    const t = this.transport;
    t.events = true;
    t.onEvent = (msg) => this.active && this.onEvent(msg);
    t.onOpen = () => {
      if (!this.active) return;
      this.attempt = 0;
      this.onConnected();
    };
    t.onClose = () => this._retry();
    if (t.ws && t.ws.readyState === 1) t.ws.send(JSON.stringify({ type: "subscribe" })); // already open
    this._connect();
  }

  stop() {
    this.active = false;
    clearTimeout(this.timer);
    Object.assign(this.transport, { events: false, onEvent: null, onOpen: null, onClose: null });
  }

  _connect() {
    if (!this.active) return;
    this.transport.connect().catch(() => this._retry());
  }

  _retry() {
    if (!this.active || this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = 0;
      this._connect();
    }, backoffDelay(++this.attempt));
  }
}

export class Push {
  /**
   * @param ws           the page's WsTransport
   * @param onEvent      ({event, ...fields}): one of the user's events
   * @param onConnected  (again): the channel is up; `again` after a reconnect (events were missed)
   */
  constructor({ ws, onEvent, onConnected }) {
    let connections = 0; // over either channel: any but the page's first follows a gap
    const connected = () => onConnected(connections++ > 0);
    this.channels = {
      sse: new SsePush({ onEvent, onConnected: connected }),
      ws: new WsPush({ transport: ws, onEvent, onConnected: connected }),
    };
    this.mode = null;
  }

  /** Carry the push channel over `mode` ("sse" or "ws"), the transport the page streams over. */
  use(mode) {
    if (mode === this.mode) return;
    if (this.mode) this.channels[this.mode].stop();
    this.mode = mode;
    this.channels[mode].start();
  }
}
