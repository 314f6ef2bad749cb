/**
 * Drives one assistant reply over a transport (SSE or WebSocket): send or resume, reconnect with
 * exponential backoff from the last event id after a dropped connection, Stop, and the end states.
 * No DOM here: the page passes hooks, and node tests pass fake transports.
 *
 * A transport has:
 *   name                      "sse" | "ws"
 *   stopsByAbort              true if Stop should drop the connection at once (SSE)
 *   open(request, signal)     async iterable of {type, id, data}; request is
 *                             {kind: "send", conversationId, content, clientRef},
 *                             {kind: "regenerate", messageId} (answer that reply's question
 *                             again, a new version in its place), {kind: "edit", messageId,
 *                             content} (a new version of the user's message) or
 *                             {kind: "resume", messageId, after}
 *   cancel(messageId)         asks the server to stop the reply; resolves to {status} when the
 *                             server answered, null when its answer is the final event (WS);
 *                             throws when the request failed
 *   reset?()                  drop the underlying connection (e.g. when the browser goes offline)
 * and throws ApiError (with .status) for HTTP errors, RejectedError for a refused send, anything
 * else for a lost connection.
 */

import { ReplyState, backoffDelay, FINAL_STATUSES } from "./reply.js";

export class RejectedError extends Error {
  constructor(detail) {
    super(detail || "The server refused the message.");
    this.name = "RejectedError";
    this.detail = this.message;
  }
}

export class ConnectionLost extends Error {
  constructor(message = "The connection was lost.") {
    super(message);
    this.name = "ConnectionLost";
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

function defaultIsOnline() {
  return typeof navigator === "undefined" || navigator.onLine !== false;
}

function defaultWaitOnline(signal) {
  if (defaultIsOnline() || typeof window === "undefined") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      window.removeEventListener("online", done);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    window.addEventListener("online", done);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** HTTP statuses after which a resume is pointless (the message is gone or not ours). */
const FATAL_RESUME = new Set([400, 401, 403, 404, 410, 422]);

export class ReplyStream {
  /**
   * @param transport  see above
   * @param request    {kind: "send", conversationId, content}, {kind: "regenerate", messageId}
   *                   or {kind: "resume"} (uses state)
   * @param state      a ReplyState (a new one for a send; the existing one for a resume)
   * @param hooks      {onStart, onText, onReconnecting, onStopping, onStopFailed, onFinal, onRejected,
   *                   onFirstDelta}
   */
  constructor({ transport, request, state = new ReplyState(), hooks = {}, options = {} }) {
    this.transport = transport;
    this.request = request;
    this.state = state;
    this.hooks = hooks;
    this.opts = {
      maxAttempts: 8,
      stopGraceMs: 5000, // how long Stop waits for the server to confirm (WS) or for the tail (SSE)
      sleep,
      backoff: backoffDelay,
      isOnline: defaultIsOnline,
      waitOnline: defaultWaitOnline,
      ...options,
    };
    this.stopRequested = false;
    this.cancelSent = false;
    this.cancelPromise = null;
    this.attemptCtl = null;
    this.life = new AbortController(); // aborted when the stream is over
    this.stopCtl = new AbortController(); // aborted by Stop: cuts a backoff wait short
    this.sawDelta = false;
    this.reconnects = 0;
    this.finished = null; // the promise of run()
  }

  _hook(name, ...args) {
    const fn = this.hooks[name];
    if (fn) {
      try {
        fn(...args);
      } catch (e) {
        console.error(`hook ${name} failed`, e);
      }
    }
  }

  /** Run to the end; resolves to the ReplyState (whose status is final, or "truncated"). */
  run() {
    if (!this.finished) {
      this.finished = this._run().finally(() => {
        clearTimeout(this.stopTimer);
        this.life.abort();
      });
    }
    return this.finished;
  }

  /**
   * The user pressed Stop (or Esc). The reply is "stopping" until the server confirms (the cancel
   * request's answer, or the final event); if it cannot be reached, the reply goes on and
   * onStopFailed says so (Stop can be pressed again).
   */
  stop() {
    if (this.state.done || this.stopRequested) return;
    this.stopRequested = true;
    this.stopCtl.abort();
    this._hook("onStopping", this.state);
    if (this.state.messageId) {
      this._cancelNow();
    } else {
      // No message id yet: cancel as soon as the start event names it; give up after a while.
      this.stopTimer = setTimeout(() => this.attemptCtl?.abort(), this.opts.stopGraceMs);
    }
  }

  /** Drop the current connection and reconnect (the browser went offline, or the socket looks dead). */
  interrupt() {
    if (this.state.done) return;
    this.transport.reset?.();
    this.attemptCtl?.abort(new ConnectionLost("offline"));
  }

  _cancelNow() {
    if (this.cancelSent || !this.state.messageId) return;
    this.cancelSent = true;
    clearTimeout(this.stopTimer);
    const asked = (async () => this.transport.cancel(this.state.messageId))();
    this.cancelPromise = asked.then((res) => ({ ok: true, res }), (error) => ({ ok: false, error }));
    this.cancelPromise.then(({ ok, res, error }) => {
      if (!ok) return this._stopFailed(error);
      if (res == null) return; // WS: the final event is the answer
      clearTimeout(this.stopTimer);
      // SSE: the server has stopped the reply: stop reading; the tail and the final come after.
      if (this.transport.stopsByAbort) this.attemptCtl?.abort();
    });
    // WS: the final event arrives on the same socket; none in time means the cancel was lost.
    if (!this.transport.stopsByAbort) {
      this.stopTimer = setTimeout(() => this._stopFailed(new Error("the server did not confirm it")), this.opts.stopGraceMs);
    }
  }

  /** The cancel request failed or went unanswered: the reply goes on, and Stop can be pressed again. */
  _stopFailed(error) {
    if (this.state.done || !this.stopRequested) return;
    clearTimeout(this.stopTimer);
    this.stopRequested = false;
    this.cancelSent = false;
    this.stopCtl = new AbortController();
    this._hook("onStopFailed", this.state, error);
  }

  /** Apply one event; true when it ends the reply. */
  _handle(ev) {
    const s = this.state;
    const data = ev.data || {};
    if (s.messageId && data.message_id != null && String(data.message_id) !== s.messageId) return false;
    switch (ev.type) {
      case "start":
        s.start(data);
        this._hook("onStart", s);
        if (this.stopRequested) this._cancelNow();
        return false;
      case "delta": {
        const added = s.delta(data.text, ev.id);
        if (added) {
          if (!this.sawDelta) {
            this.sawDelta = true;
            this._hook("onFirstDelta", s);
          }
          this._hook("onText", s, added);
        }
        return false;
      }
      case "final":
      case "error":
        s.finish(data, ev.type);
        return true;
      default:
        return false; // ping and anything new
    }
  }

  async _run() {
    const s = this.state;
    // A send or a regenerate goes out once; every reconnect after it is a resume.
    let request = this.request.kind === "resume" ? { kind: "resume" } : this.request;
    let attempt = 0;
    for (;;) {
      if (request.kind === "resume") request = { kind: "resume", messageId: s.messageId, after: s.offset };
      this.attemptCtl = new AbortController();
      const before = s.offset;
      try {
        for await (const ev of this.transport.open(request, this.attemptCtl.signal)) {
          if (this._handle(ev)) return this._end();
          if (s.offset > before) attempt = 0; // progress: the next drop starts the backoff again
        }
        throw new ConnectionLost("The stream ended without its final event.");
      } catch (err) {
        if (this.stopRequested) {
          const end = await this._finishStop();
          if (end) return end;
          request = { kind: "resume" }; // the stop failed: carry on
          continue;
        }
        if (!s.messageId) {
          // Nothing to resume: the server never named the reply.
          if (err instanceof RejectedError || (err?.status >= 400 && err?.status < 500)) {
            s.status = "rejected";
            s.error = err.detail || err.message;
            this._hook("onRejected", s, err);
            return s;
          }
          s.status = "failed";
          s.error = err?.status
            ? `The server could not start the reply (${err.detail || err.status}).`
            : "Could not reach the server; the message may not have been sent.";
          s.notSent = true;
          return this._end();
        }
        if (request.kind === "resume" && FATAL_RESUME.has(err?.status)) {
          s.truncate(`The reply could not be resumed (${err.detail || err.status}).`);
          return this._end();
        }
        attempt++;
        if (attempt > this.opts.maxAttempts) {
          s.truncate("The connection was lost and could not be re-established.");
          return this._end();
        }
        const delay = this.opts.backoff(attempt);
        this.reconnects++;
        this._hook("onReconnecting", s, { attempt, delay, offline: !this.opts.isOnline(), error: err });
        await this.opts.waitOnline(this.stopCtl.signal);
        await this.opts.sleep(delay, this.stopCtl.signal);
        request = { kind: "resume" };
        if (this.stopRequested) {
          const end = await this._finishStop();
          if (end) return end;
        }
      }
    }
  }

  /**
   * After Stop: collect the tail the server kept and its final event, briefly; else end locally,
   * if the server confirmed the stop. Null when the stop failed (the caller carries on streaming).
   */
  async _finishStop() {
    const s = this.state;
    if (s.done) return this._end();
    if (!s.messageId) {
      s.status = "cancelled";
      s.stoppedBy = "user";
      s.error = null;
      return this._end();
    }
    this._cancelNow();
    const { ok, res } = await this.cancelPromise;
    if (!ok || !this.stopRequested) return null;
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), this.opts.stopGraceMs);
    try {
      for await (const ev of this.transport.open({ kind: "resume", messageId: s.messageId, after: s.offset }, ctl.signal)) {
        if (this._handle(ev)) return this._end();
      }
    } catch {
      /* fall through to a local end */
    } finally {
      clearTimeout(t);
    }
    if (res == null) {
      // WS, and no final came: nothing says the server stopped.
      this._stopFailed(new Error("the server did not confirm it"));
      return null;
    }
    const status = FINAL_STATUSES.has(res.status) ? res.status : "cancelled";
    s.finish({ status, finish_reason: null, usage: s.usage, timings: s.timings, error: null, stopped_by: "user" });
    return this._end();
  }

  _end() {
    this._hook("onFinal", this.state);
    return this.state;
  }
}
