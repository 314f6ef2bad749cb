// Unit tests for reply state, reconnect/resume, Stop and end states: node --test tests/js/
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { ReplyState, cpLen, cpSkip, backoffDelay, tokensPerSecond } from "../../static/js/reply.js";
import { ReplyStream, RejectedError, ConnectionLost } from "../../static/js/stream.js";
import { WsTransport } from "../../static/js/transport-ws.js";

class HttpErr extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

test("cpLen/cpSkip count code points like Python, not UTF-16 units", () => {
  assert.equal(cpLen("a👋🏽b"), 4); // 👋 + skin tone modifier = 2 code points (4 UTF-16 units)
  assert.equal("a👋🏽b".length, 6);
  assert.equal(cpSkip("👋x日本", 2), "日本");
  assert.equal(cpSkip("abc", 0), "abc");
  assert.equal(cpSkip("abc", 5), "");
});

test("ReplyState.delta appends only text it does not have (offsets in code points)", () => {
  const s = new ReplyState();
  assert.equal(s.delta("Hi 👋", 4), "Hi 👋");
  assert.equal(s.delta("Hi 👋", 4), ""); // replay
  assert.equal(s.delta("👋 there", 10), " there"); // overlaps: starts at 3
  assert.equal(s.text, "Hi 👋 there");
  assert.equal(s.offset, 10);
  assert.equal(s.delta("e", 9), ""); // old
  assert.equal(s.delta("!", 11), "!");
  assert.equal(s.text, "Hi 👋 there!");
  assert.equal(s.gap, false);
  assert.equal(s.delta("?", 20), "?");
  assert.equal(s.gap, true);
});

test("ReplyState.finish maps error events to failed; unknown statuses to failed", () => {
  const s = new ReplyState();
  s.finish({ status: "failed", error: "boom" }, "error");
  assert.equal(s.status, "failed");
  assert.equal(s.error, "boom");
  const t = new ReplyState();
  t.finish({ status: "weird" });
  assert.equal(t.status, "failed");
  const u = new ReplyState();
  u.finish({ status: "length", finish_reason: "length", usage: { completion_tokens: 5 } });
  assert.equal(u.status, "length");
});

test("ReplyState.fromRow", () => {
  const s = ReplyState.fromRow({
    id: 7, content: "abc", status: "cancelled", prompt_tokens: 3, completion_tokens: 9, ttft_ms: 120,
    created_at: "2024-01-01T00:00:00Z", finished_at: "2024-01-01T00:00:02Z",
  });
  assert.equal(s.messageId, "7");
  assert.equal(s.offset, 3);
  assert.equal(s.timings.total_ms, 2000);
  assert.equal(Math.round(tokensPerSecond(s.usage, s.timings)), Math.round((8 * 1000) / 1880));
});

test("backoff doubles and caps", () => {
  const b = (n) => backoffDelay(n, { jitter: 0, random: () => 0.5 });
  assert.deepEqual([1, 2, 3, 4, 5, 6, 7, 8].map(b), [500, 1000, 2000, 4000, 8000, 15000, 15000, 15000]);
  const lo = backoffDelay(3, { random: () => 0 });
  const hi = backoffDelay(3, { random: () => 1 });
  assert.ok(lo >= 1500 && hi <= 2500);
});

// ---- a scripted fake transport -----------------------------------------------------------

const ev = {
  start: (id = 0, offset = id) => ({ type: "start", id, data: { message_id: "m1", conversation_id: "c1", user_message_id: "u1", offset } }),
  delta: (id, text) => ({ type: "delta", id, data: { message_id: "m1", text } }),
  final: (id, status = "completed") => ({ type: "final", id, data: { message_id: "m1", status, finish_reason: status === "completed" ? "stop" : null, usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 }, timings: { ttft_ms: 10, total_ms: 50 } } }),
  error: (id) => ({ type: "error", id, data: { message_id: "m1", status: "failed", error: "engine exploded" } }),
};

/**
 * Each open() consumes the next script: an array of events, optionally ending with
 * {throw: err} or {hang: true} (waits until aborted). Records requests.
 */
class FakeTransport {
  constructor(scripts, { stopsByAbort = true, cancelResult = { status: "cancelled" } } = {}) {
    this.name = "fake";
    this.scripts = scripts;
    this.requests = [];
    this.cancels = [];
    this.stopsByAbort = stopsByAbort;
    this.cancelResult = cancelResult;
    this.resets = 0;
  }
  reset() {
    this.resets++;
  }
  async *open(request, signal) {
    this.requests.push(structuredClone(request));
    const script = this.scripts.shift() || [{ throw: new HttpErr(404, "gone") }];
    for (const step of script) {
      await new Promise((r) => setImmediate(r));
      if (signal.aborted) throw Object.assign(new Error("aborted"), { name: "AbortError" });
      if (typeof step === "function") {
        step(this);
        continue;
      }
      if (step.throw) throw step.throw;
      if (step.wait) {
        await new Promise((r) => setTimeout(r, step.wait));
        continue;
      }
      if (step.hang) {
        await new Promise((_, reject) => {
          if (signal.aborted) reject(Object.assign(new Error("aborted"), { name: "AbortError" }));
          signal.addEventListener("abort", () => reject(Object.assign(new Error("aborted"), { name: "AbortError" })), { once: true });
        });
      }
      yield step;
    }
  }
  async cancel(messageId) {
    this.cancels.push(messageId);
    const result = typeof this.cancelResult === "function" ? this.cancelResult(this.cancels.length) : this.cancelResult;
    if (result instanceof Error) throw result;
    return result;
  }
}

const fast = { sleep: () => Promise.resolve(), waitOnline: () => Promise.resolve(), isOnline: () => true, stopGraceMs: 200 };

function run(transport, request = { kind: "send", conversationId: "c1", content: "hi" }, state, extra = {}) {
  const log = [];
  const hooks = {
    onStart: () => log.push("start"),
    onText: (_s, t) => log.push(`+${t}`),
    onReconnecting: (_s, info) => log.push(`reconnect#${info.attempt}`),
    onFinal: (s) => log.push(`end:${s.status}`),
    onStopping: () => log.push("stopping"),
    onStopFailed: (_s, err) => log.push(`stop-failed:${err.message}`),
    onRejected: (s) => log.push(`rejected:${s.error}`),
    onFirstDelta: () => log.push("first"),
  };
  const rs = new ReplyStream({ transport, request, state, hooks, options: { ...fast, ...extra } });
  return { rs, log, done: rs.run() };
}

test("a plain reply", async () => {
  const t = new FakeTransport([[ev.start(), ev.delta(5, "Hello"), ev.delta(11, " world"), ev.final(11)]]);
  const { log, done } = run(t);
  const s = await done;
  assert.equal(s.text, "Hello world");
  assert.equal(s.status, "completed");
  assert.equal(s.messageId, "m1");
  assert.deepEqual(log, ["start", "first", "+Hello", "+ world", "end:completed"]);
});

test("dropped mid-stream: resumes from the last id with no duplicated text", async () => {
  const t = new FakeTransport([
    [ev.start(), ev.delta(3, "Hé👋"), { throw: new TypeError("network error") }],
    // the server replays from what we asked, and even overlaps a little: still no duplicates
    [ev.start(3), ev.delta(3, "Hé👋"), ev.delta(6, " yo"), { throw: new ConnectionLost() }],
    [ev.start(6), ev.delta(8, "!!"), ev.final(8)],
  ]);
  const { log, done } = run(t);
  const s = await done;
  assert.equal(s.text, "Hé👋 yo!!");
  assert.equal(s.status, "completed");
  assert.deepEqual(t.requests.slice(1), [
    { kind: "resume", messageId: "m1", after: 3 },
    { kind: "resume", messageId: "m1", after: 6 },
  ]);
  assert.ok(log.includes("reconnect#1"));
});

test("a regenerate goes out once; after a drop the NEW reply is resumed, not regenerated again", async () => {
  const t = new FakeTransport([
    [ev.start(), ev.delta(4, "Fres"), { throw: new TypeError("network error") }],
    [ev.start(4), ev.delta(6, "h!"), ev.final(6)],
  ]);
  const { done } = run(t, { kind: "regenerate", messageId: "old" });
  const s = await done;
  assert.equal(s.text, "Fresh!");
  assert.equal(s.messageId, "m1");
  assert.deepEqual(t.requests, [
    { kind: "regenerate", messageId: "old" },
    { kind: "resume", messageId: "m1", after: 4 },
  ]);
});

test("a refused regenerate (409) is rejected with the server's reason, not retried", async () => {
  const t = new FakeTransport([[{ throw: new HttpErr(409, "only the latest reply can be regenerated") }]]);
  const { log, done } = run(t, { kind: "regenerate", messageId: "old" });
  const s = await done;
  assert.equal(s.status, "rejected");
  assert.deepEqual(log, ["rejected:only the latest reply can be regenerated"]);
  assert.equal(t.requests.length, 1);
});

test("a stream that ends without its final event is resumed, then shown truncated when resume is impossible", async () => {
  const t = new FakeTransport([[ev.start(), ev.delta(4, "part")], [{ throw: new HttpErr(404, "no such message") }]]);
  const { done } = run(t);
  const s = await done;
  assert.equal(s.status, "truncated");
  assert.equal(s.text, "part");
});

test("gives up after maxAttempts reconnects without progress: truncated, never completed", async () => {
  const scripts = [[ev.start(), ev.delta(1, "x")]];
  for (let k = 0; k < 10; k++) scripts.push([ev.start(1), { throw: new TypeError("down") }]);
  const t = new FakeTransport(scripts);
  const { log, done } = run(t, undefined, undefined, { maxAttempts: 3 });
  const s = await done;
  assert.equal(s.status, "truncated");
  assert.equal(log.filter((l) => l.startsWith("reconnect")).length, 3);
});

test("in-band error keeps the text and ends failed", async () => {
  const t = new FakeTransport([[ev.start(), ev.delta(4, "some"), ev.error(4)]]);
  const { done } = run(t);
  const s = await done;
  assert.equal(s.status, "failed");
  assert.equal(s.text, "some");
  assert.equal(s.error, "engine exploded");
});

test("4xx before the stream starts: rejected, nothing to resume", async () => {
  const t = new FakeTransport([[{ throw: new HttpErr(400, "prompt too long") }]]);
  const { log, done } = run(t);
  const s = await done;
  assert.equal(s.status, "rejected");
  assert.deepEqual(log, ["rejected:prompt too long"]);
  const t2 = new FakeTransport([[{ throw: new RejectedError("empty message") }]]);
  assert.equal((await run(t2).done).status, "rejected");
});

test("network failure before start: failed and marked not sent (no blind resend)", async () => {
  const t = new FakeTransport([[{ throw: new TypeError("Failed to fetch") }]]);
  const s = await run(t).done;
  assert.equal(s.status, "failed");
  assert.equal(s.notSent, true);
  assert.equal(t.requests.length, 1);
});

test("Stop over SSE: aborts at once, cancels on the server, collects the tail and the final", async () => {
  let rs;
  const t = new FakeTransport([
    [ev.start(), ev.delta(3, "abc"), () => rs.stop(), ev.delta(6, "def"), { hang: true }],
    [ev.start(3), ev.delta(4, "d"), ev.final(4, "cancelled")],
  ]);
  const r = run(t);
  rs = r.rs;
  const s = await r.done;
  assert.deepEqual(t.cancels, ["m1"]);
  assert.equal(s.status, "cancelled");
  // "def" was never read (the fetch was aborted); the server's tail "d" was.
  assert.equal(s.text, "abcd");
  assert.deepEqual(t.requests[1], { kind: "resume", messageId: "m1", after: 3 });
});

test("Stop when the tail cannot be fetched: ends cancelled locally, with the text kept", async () => {
  let rs;
  const t = new FakeTransport([[ev.start(), ev.delta(3, "abc"), () => rs.stop(), { hang: true }], [{ throw: new TypeError("down") }]]);
  const r = run(t);
  rs = r.rs;
  const s = await r.done;
  assert.equal(s.status, "cancelled");
  assert.equal(s.text, "abc");
});

test("Stop over WS: sends cancel and keeps reading until the final", async () => {
  let rs;
  const t = new FakeTransport([[ev.start(), ev.delta(3, "abc"), () => rs.stop(), ev.delta(4, "d"), ev.final(4, "cancelled")]], { stopsByAbort: false });
  const r = run(t);
  rs = r.rs;
  const s = await r.done;
  assert.deepEqual(t.cancels, ["m1"]);
  assert.equal(s.status, "cancelled");
  assert.equal(s.text, "abcd");
  assert.equal(t.requests.length, 1);
});

test("Stop over SSE when the cancel request fails: not stopped, the reply goes on, Stop again works", async () => {
  let rs;
  const t = new FakeTransport(
    [
      [ev.start(), ev.delta(3, "abc"), () => rs.stop(), ev.delta(6, "def"), () => rs.stop(), ev.delta(7, "g"), { hang: true }],
      [ev.start(7), ev.delta(8, "h"), ev.final(8, "cancelled")],
    ],
    { cancelResult: (n) => (n === 1 ? new TypeError("Failed to fetch") : { status: "cancelled" }) },
  );
  const r = run(t);
  rs = r.rs;
  const s = await r.done;
  assert.deepEqual(t.cancels, ["m1", "m1"]);
  // The first Stop failed: the text kept coming ("def"), and the page was told, before any end.
  assert.deepEqual(r.log.filter((x) => /stop|end/.test(x)), ["stopping", "stop-failed:Failed to fetch", "stopping", "end:cancelled"]);
  assert.equal(s.status, "cancelled");
  assert.equal(s.text, "abcdefh");
});

test("Stop over WS when the cancel frame is lost: no final in time, so not stopped; the reply goes on", async () => {
  let rs;
  const t = new FakeTransport(
    [[ev.start(), ev.delta(3, "abc"), () => rs.stop(), { wait: 60 }, ev.delta(4, "d"), ev.final(4, "completed")]],
    { stopsByAbort: false, cancelResult: null },
  );
  const r = run(t, undefined, undefined, { stopGraceMs: 20 });
  rs = r.rs;
  const s = await r.done;
  assert.deepEqual(r.log.filter((x) => /stop|end/.test(x)), ["stopping", "stop-failed:the server did not confirm it", "end:completed"]);
  assert.equal(s.status, "completed");
  assert.equal(s.text, "abcd");
});

test("Stop before the start event: cancels as soon as the message id is known", async () => {
  let rs;
  const t = new FakeTransport([[() => rs.stop(), ev.start(), ev.delta(1, "a"), { hang: true }], [ev.start(0), ev.final(0, "cancelled")]]);
  const r = run(t);
  rs = r.rs;
  const s = await r.done;
  assert.deepEqual(t.cancels, ["m1"]);
  assert.equal(s.status, "cancelled");
});

test("Stop during a reconnect wait ends the reply", async () => {
  let rs;
  let release;
  const t = new FakeTransport([[ev.start(), ev.delta(1, "a"), { throw: new TypeError("down") }], [ev.start(1), ev.final(1, "cancelled")]]);
  const r = run(t, undefined, undefined, {
    sleep: (_ms, signal) => new Promise((res) => { release = res; signal.addEventListener("abort", res, { once: true }); }),
  });
  rs = r.rs;
  await new Promise((res) => setTimeout(res, 20));
  rs.stop();
  const s = await r.done;
  assert.equal(s.status, "cancelled");
  assert.deepEqual(t.cancels, ["m1"]);
});

test("interrupt() (offline) drops the connection and resumes", async () => {
  let rs;
  const t = new FakeTransport([[ev.start(), ev.delta(2, "ab"), () => rs.interrupt(), { hang: true }], [ev.start(2), ev.delta(3, "c"), ev.final(3)]]);
  const r = run(t);
  rs = r.rs;
  const s = await r.done;
  assert.equal(s.text, "abc");
  assert.equal(s.status, "completed");
  assert.equal(t.resets, 1);
});

test("resume of an existing reply (page reload) starts from its stored length", async () => {
  const state = new ReplyState({ messageId: "m1", text: "Hello 👋" });
  const t = new FakeTransport([[ev.start(7), ev.delta(13, " there"), ev.final(13)]]);
  const s = await run(t, { kind: "resume" }, state).done;
  assert.deepEqual(t.requests[0], { kind: "resume", messageId: "m1", after: 7 });
  assert.equal(s.text, "Hello 👋 there");
});

// ---- the WebSocket transport with a fake socket ------------------------------------------

class FakeSocket {
  static last = null;
  static all = [];
  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.last = this;
    FakeSocket.all.push(this);
    setImmediate(() => {
      this.readyState = 1;
      this.onopen?.();
    });
  }
  send(s) {
    this.sent.push(JSON.parse(s));
  }
  close(code = 1000) {
    if (this.readyState === 3) return;
    this.readyState = 3;
    setImmediate(() => this.onclose?.({ code, reason: "" }));
  }
  serverSend(obj) {
    this.onmessage?.({ data: JSON.stringify(obj) });
  }
  serverClose(code = 1006) {
    this.readyState = 3;
    this.onclose?.({ code, reason: "" });
  }
}

const tick = () => new Promise((r) => setTimeout(r, 5));
async function until(cond, ms = 1000) {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 1));
  }
}

// Every transport a test opens is reset when the file is done: an open socket keeps its stall
// watchdog (a 60 s timer) pending, and Node would wait for it before exiting.
const openTransports = [];
function openWs(options) {
  const ws = new WsTransport(options);
  openTransports.push(ws);
  return ws;
}
after(() => {
  for (const ws of openTransports) ws.reset();
});

test("WS: send, route by client_ref then message_id, pings ignored, final ends", async () => {
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const before = FakeSocket.all.length;
  const { done } = run(ws);
  await until(() => FakeSocket.all.length > before && FakeSocket.last.sent.length > 0);
  const sock = FakeSocket.last;
  const send = sock.sent[0];
  assert.equal(send.type, "send");
  assert.equal(send.conversation_id, "c1");
  assert.equal(send.content, "hi");
  sock.serverSend({ type: "ping" });
  sock.serverSend({ type: "start", id: 0, message_id: "m1", conversation_id: "c1", offset: 0, client_ref: send.client_ref });
  sock.serverSend({ type: "delta", id: 2, message_id: "other", text: "zz" });
  sock.serverSend({ type: "delta", id: 2, message_id: "m1", text: "ok" });
  sock.serverSend({ type: "final", id: 2, message_id: "m1", status: "completed", usage: {}, timings: {} });
  const s = await done;
  assert.equal(s.text, "ok");
  assert.equal(s.status, "completed");
});

test("WS: socket closes mid-reply -> new socket, resume with after=last id", async () => {
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const { done } = run(ws);
  await tick();
  const s1 = FakeSocket.last;
  s1.serverSend({ type: "start", id: 0, message_id: "m1", offset: 0, client_ref: s1.sent[0].client_ref });
  s1.serverSend({ type: "delta", id: 3, message_id: "m1", text: "abc" });
  s1.serverClose();
  await tick();
  const s2 = FakeSocket.last;
  assert.notEqual(s1, s2);
  const { client_ref, ...resume } = s2.sent[0];
  assert.deepEqual(resume, { type: "resume", message_id: "m1", after: 3 });
  assert.notEqual(client_ref, s1.sent[0].client_ref);
  s2.serverSend({ type: "start", id: 3, message_id: "m1", offset: 3, client_ref });
  s2.serverSend({ type: "delta", id: 5, message_id: "m1", text: "de" });
  s2.serverSend({ type: "final", id: 5, message_id: "m1", status: "completed" });
  const s = await done;
  assert.equal(s.text, "abcde");
});

test("WS: rejected send", async () => {
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const { done } = run(ws);
  await tick();
  const sock = FakeSocket.last;
  sock.serverSend({ type: "rejected", error: "message is empty", client_ref: sock.sent[0].client_ref });
  const s = await done;
  assert.equal(s.status, "rejected");
  assert.equal(s.error, "message is empty");
});

test("WS: regenerate sends a regenerate frame with a client_ref; its start routes the new reply", async () => {
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const before = FakeSocket.all.length;
  const { done } = run(ws, { kind: "regenerate", messageId: "old" });
  await until(() => FakeSocket.all.length > before && FakeSocket.last.sent.length > 0);
  const sock = FakeSocket.last;
  const frame = sock.sent[0];
  assert.deepEqual(Object.keys(frame).sort(), ["client_ref", "message_id", "type"]);
  assert.equal(frame.type, "regenerate");
  assert.equal(frame.message_id, "old");
  sock.serverSend({ type: "start", id: 0, message_id: "m2", conversation_id: "c1", offset: 0, client_ref: frame.client_ref });
  sock.serverSend({ type: "delta", id: 3, message_id: "m2", text: "new" });
  sock.serverSend({ type: "final", id: 3, message_id: "m2", status: "completed", usage: {}, timings: {} });
  const s = await done;
  assert.equal(s.messageId, "m2");
  assert.equal(s.text, "new");
});

test("WS: Stop sends a cancel frame on the socket and reads the final", async () => {
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const before = FakeSocket.all.length;
  const { rs, done } = run(ws);
  await until(() => FakeSocket.all.length > before && FakeSocket.last.sent.length > 0);
  const sock = FakeSocket.last;
  sock.serverSend({ type: "start", id: 0, message_id: "m1", offset: 0, client_ref: sock.sent[0].client_ref });
  sock.serverSend({ type: "delta", id: 1, message_id: "m1", text: "a" });
  await until(() => rs.state.text === "a");
  rs.stop();
  assert.deepEqual(sock.sent[1], { type: "cancel", message_id: "m1" });
  sock.serverSend({ type: "final", id: 1, message_id: "m1", status: "cancelled" });
  const s = await done;
  assert.equal(s.status, "cancelled");
});

test("WS: a refused resume reaches the resuming reply by its client_ref: truncated, not retried forever", async () => {
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const state = new ReplyState({ messageId: "m9", text: "abc" });
  const before = FakeSocket.all.length;
  const { done } = run(ws, { kind: "resume" }, state);
  await until(() => FakeSocket.all.length > before && FakeSocket.last.sent.length > 0);
  const sock = FakeSocket.last;
  const { client_ref, ...resume } = sock.sent[0];
  assert.deepEqual(resume, { type: "resume", message_id: "m9", after: 3 });
  sock.serverSend({ type: "rejected", error: "no such message", client_ref, status: 404 });
  const s = await done;
  assert.equal(s.status, "truncated");
  assert.equal(s.text, "abc");
});

test("WS: close code 4401 calls the unauthorized hook", async () => {
  let called = 0;
  const ws = openWs({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket, onUnauthorized: () => called++ });
  const before = FakeSocket.all.length;
  const { done } = run(ws);
  await until(() => FakeSocket.all.length > before && FakeSocket.last.sent.length > 0);
  FakeSocket.last.serverClose(4401);
  const s = await done;
  assert.equal(called, 1);
  assert.equal(s.status, "failed");
  assert.equal(s.notSent, true);
});
