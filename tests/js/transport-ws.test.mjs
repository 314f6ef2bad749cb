// The WebSocket transport correlates the server's answers by the client_ref each request frame
// carries (static/js/transport-ws.js): node --test tests/js/
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { RejectedError } from "../../static/js/stream.js";
import { WsTransport } from "../../static/js/transport-ws.js";

class FakeSocket {
  static last = null;
  constructor() {
    this.readyState = 0;
    this.sent = [];
    FakeSocket.last = this;
    setImmediate(() => {
      this.readyState = 1;
      this.onopen?.();
    });
  }
  send(s) {
    this.sent.push(JSON.parse(s));
  }
  close() {
    this.readyState = 3;
  }
  serverSend(obj) {
    this.onmessage?.({ data: JSON.stringify(obj) });
  }
}

async function until(cond, ms = 1000) {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** Read one request's events until its end (or its refusal) into a list. */
function read(ws, request) {
  const events = [];
  const done = (async () => {
    try {
      for await (const ev of ws.open(request, new AbortController().signal)) events.push(ev.type === "delta" ? ev.data.text : ev.type);
    } catch (err) {
      events.push(err);
    }
    return events;
  })();
  return done;
}

// Each transport is reset when the file is done: an open socket keeps its 60 s stall watchdog
// pending, and Node would wait for it before exiting.
const opened = [];
const transport = () => {
  const ws = new WsTransport({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  opened.push(ws);
  return ws;
};
after(() => {
  for (const ws of opened) ws.reset();
});
const send = (content) => ({ kind: "send", conversationId: "c1", content });
const start = (messageId, client_ref) => ({ type: "start", id: 0, message_id: messageId, conversation_id: "c1", offset: 0, client_ref });
const delta = (messageId, text) => ({ type: "delta", id: text.length, message_id: messageId, text });
const final = (messageId) => ({ type: "final", id: 1, message_id: messageId, status: "completed" });

test("every request frame carries its own client_ref", async () => {
  const ws = transport();
  read(ws, send("a"));
  read(ws, { kind: "regenerate", messageId: "m0" });
  read(ws, { kind: "edit", messageId: "m0", content: "b" });
  read(ws, { kind: "resume", messageId: "m0", after: 2 });
  await until(() => FakeSocket.last?.sent.length === 4);
  const refs = FakeSocket.last.sent.map((f) => f.client_ref);
  assert.deepEqual(FakeSocket.last.sent.map((f) => f.type), ["send", "regenerate", "edit", "resume"]);
  assert.ok(refs.every((r) => typeof r === "string" && r.length > 0));
  assert.equal(new Set(refs).size, 4);
});

test("a send names the message it follows, the last one on the page's screen, when there is one", async () => {
  const ws = transport();
  read(ws, { ...send("after m7"), parentId: "m7" });
  read(ws, send("first of a conversation"));
  await until(() => FakeSocket.last?.sent.length === 2);
  const [after, first] = FakeSocket.last.sent;
  assert.equal(after.parent_id, "m7");
  assert.equal("parent_id" in first, false);
});

test("two sends in flight: each start, in any order, reaches the reply that asked", async () => {
  const ws = transport();
  const first = read(ws, send("first"));
  const second = read(ws, send("second"));
  await until(() => FakeSocket.last?.sent.length === 2);
  const sock = FakeSocket.last;
  const [a, b] = sock.sent;
  sock.serverSend(start("m2", b.client_ref)); // the second answered first
  sock.serverSend(start("m1", a.client_ref));
  sock.serverSend(delta("m1", "one"));
  sock.serverSend(delta("m2", "two"));
  sock.serverSend(final("m2"));
  sock.serverSend(final("m1"));
  assert.deepEqual(await first, ["start", "one", "final"]);
  assert.deepEqual(await second, ["start", "two", "final"]);
});

test("a refusal reaches the request it names, not the oldest one waiting", async () => {
  const ws = transport();
  const first = read(ws, { kind: "resume", messageId: "m1", after: 0 });
  const second = read(ws, { kind: "resume", messageId: "m2", after: 0 });
  await until(() => FakeSocket.last?.sent.length === 2);
  const sock = FakeSocket.last;
  sock.serverSend({ type: "rejected", error: "no such message", client_ref: sock.sent[1].client_ref, status: 404 });
  const [refused] = await second;
  assert.ok(refused instanceof RejectedError);
  assert.equal(refused.status, 404);
  assert.equal(refused.detail, "no such message");
  sock.serverSend(start("m1", sock.sent[0].client_ref));
  sock.serverSend(final("m1"));
  assert.deepEqual(await first, ["start", "final"]);
});

test("a refused frame nobody waits on (a cancel) fails no reply", async () => {
  const ws = transport();
  const resumed = read(ws, { kind: "resume", messageId: "m1", after: 0 });
  await until(() => FakeSocket.last?.sent.length === 1);
  const sock = FakeSocket.last;
  ws.cancel("m7");
  assert.deepEqual(sock.sent[1], { type: "cancel", message_id: "m7" });
  sock.serverSend({ type: "rejected", error: "no such message", client_ref: null, status: 404 });
  sock.serverSend({ type: "rejected", error: "invalid cancel request", client_ref: "someone-else" });
  sock.serverSend(start("m1", sock.sent[0].client_ref));
  sock.serverSend(final("m1"));
  assert.deepEqual(await resumed, ["start", "final"]);
});

test("a start that echoes no waiting ref is not handed to a waiting send", async () => {
  const ws = transport();
  const mine = read(ws, send("mine"));
  await until(() => FakeSocket.last?.sent.length === 1);
  const sock = FakeSocket.last;
  sock.serverSend(start("other", null)); // another page's reply, or one given up on
  sock.serverSend(delta("other", "not mine"));
  sock.serverSend(start("m1", sock.sent[0].client_ref));
  sock.serverSend(delta("m1", "mine"));
  sock.serverSend(final("m1"));
  assert.deepEqual(await mine, ["start", "mine", "final"]);
});
