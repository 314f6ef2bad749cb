// The page's side of several tabs: what TabSync does with each push event (static/js/tab-sync.js),
// and the WebSocket transport as a push channel (subscribe on open, `event` frames to onEvent).
import { test } from "node:test";
import assert from "node:assert/strict";
import { TabSync } from "../../static/js/tab-sync.js";
import { WsTransport } from "../../static/js/transport-ws.js";

/** The ConversationList's surface that TabSync uses, recording what it was asked. */
function fakeList(items, currentId = null) {
  const calls = [];
  return {
    items,
    currentId,
    calls,
    find(id) {
      return this.items.find((c) => c.id === id);
    },
    add(c) {
      this.forget(c.id);
      this.items.unshift(c);
    },
    forget(id) {
      this.items = this.items.filter((c) => c.id !== id);
    },
    touch(id) {
      calls.push(["touch", id]);
    },
    render() {
      calls.push(["render"]);
    },
    markStreaming() {
      calls.push(["markStreaming"]);
    },
    onTitle(c) {
      calls.push(["onTitle", c.id, c.title]);
    },
    filed(c) {
      calls.push(["filed", c.id, c.pinned_at, c.archived_at]);
    },
  };
}

function setup({ items = [], currentId = null, liveHere = [], shown = null } = {}) {
  const list = fakeList(items, currentId);
  const reloads = [];
  const gone = [];
  const sync = new TabSync({
    conversations: list,
    replies: { liveFor: (id) => (liveHere.includes(id) ? {} : null) },
    reload: (id) => reloads.push(id),
    onGone: (c) => gone.push(c.id),
    shownLeaf: () => shown,
  });
  return { list, sync, reloads, gone };
}

test("another version shown elsewhere re-renders the conversation on screen, unless it shows it", () => {
  const items = [{ id: "c1", title: "Dragons" }, { id: "c2", title: "Owls" }];
  const stale = setup({ items, currentId: "c1", shown: "m-2of2" });
  stale.sync.handle({ event: "branch_shown", conversation_id: "c1", leaf_id: "m-1of2" });
  assert.deepEqual(stale.reloads, ["c1"]);
  // The page that switched (it shows that branch already), another conversation, or a reply
  // streaming here: nothing to redraw.
  const switcher = setup({ items, currentId: "c1", shown: "m-1of2" });
  switcher.sync.handle({ event: "branch_shown", conversation_id: "c1", leaf_id: "m-1of2" });
  const other = setup({ items, currentId: "c2", shown: "m-9" });
  other.sync.handle({ event: "branch_shown", conversation_id: "c1", leaf_id: "m-1of2" });
  const busy = setup({ items, currentId: "c1", shown: "m-2of2", liveHere: ["c1"] });
  busy.sync.handle({ event: "branch_shown", conversation_id: "c1", leaf_id: "m-1of2" });
  assert.deepEqual([switcher.reloads, other.reloads, busy.reloads], [[], [], []]);
});

test("a reply started elsewhere in the conversation on screen is resumed here (a reload)", () => {
  const { list, sync, reloads } = setup({ items: [{ id: "c1", title: "Dragons" }], currentId: "c1" });
  sync.handle({ event: "reply_started", conversation_id: "c1", message_id: "m1" });
  assert.deepEqual(reloads, ["c1"]);
  assert.equal(sync.isLive("c1"), true);
  assert.deepEqual(list.calls.slice(0, 2), [["touch", "c1"], ["markStreaming"]]);
  sync.handle({ event: "reply_ended", conversation_id: "c1", message_id: "m1", status: "completed" });
  assert.equal(sync.isLive("c1"), false);
});

test("a reply this page streams itself, or in a conversation not on screen, is not reloaded", () => {
  const { sync, reloads } = setup({
    items: [{ id: "c1", title: "Dragons" }, { id: "c2", title: "Cats" }],
    currentId: "c1",
    liveHere: ["c1"],
  });
  sync.handle({ event: "reply_started", conversation_id: "c1", message_id: "m1" });
  sync.handle({ event: "reply_started", conversation_id: "c2", message_id: "m2" });
  assert.deepEqual(reloads, []);
  assert.equal(sync.isLive("c2"), true); // its dot in the list
  // An older reply's end does not clear the newer one's dot.
  sync.handle({ event: "reply_ended", conversation_id: "c2", message_id: "m0", status: "cancelled" });
  assert.equal(sync.isLive("c2"), true);
});

test("a new chat is named by its rename event, not by refetching on a guess", () => {
  const { list, sync } = setup({ items: [{ id: "c1", title: "New chat" }] });
  let refetched = 0;
  sync.refetch = () => refetched++;
  // A reply in a chat still untitled: had its first message named it, the rename came first.
  sync.handle({ event: "reply_started", conversation_id: "c1", message_id: "m1" });
  assert.equal(refetched, 0);
  assert.deepEqual(list.calls.slice(0, 2), [["touch", "c1"], ["markStreaming"]]);
  sync.handle({ event: "conversation_renamed", conversation_id: "c1", title: "Dragons" });
  assert.equal(list.find("c1").title, "Dragons");
  sync.handle({ event: "reply_started", conversation_id: "c9", message_id: "m9" }); // not listed
  assert.equal(refetched, 1);
});

test("created once, renamed, deleted; unknown events are ignored", () => {
  const { list, sync, gone } = setup({ items: [{ id: "c1", title: "Dragons" }], currentId: "c1" });
  const created = { event: "conversation_created", conversation_id: "c2", title: "New chat" };
  sync.handle(created);
  sync.handle(created); // the page that created it may hear it too
  assert.deepEqual(list.items.map((c) => c.id), ["c2", "c1"]);
  sync.handle({ event: "conversation_renamed", conversation_id: "c1", title: "Wyverns" });
  assert.equal(list.find("c1").title, "Wyverns");
  assert.deepEqual(list.calls.at(-1), ["onTitle", "c1", "Wyverns"]);
  sync.handle({ event: "conversation_deleted", conversation_id: "c1" });
  sync.handle({ event: "conversation_deleted", conversation_id: "c1" }); // already gone: nothing
  assert.deepEqual(list.items.map((c) => c.id), ["c2"]);
  assert.deepEqual(gone, ["c1"]);
  sync.handle({ event: "something_new", conversation_id: "c2" });
  assert.deepEqual(list.items.map((c) => c.id), ["c2"]);
});

class FakeSocket {
  static last = null;
  constructor(url) {
    this.url = url;
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
  close() {}
  serverSend(obj) {
    this.onmessage?.({ data: JSON.stringify(obj) });
  }
}

test("WS: a push socket subscribes on open and hands `event` frames to onEvent only", async () => {
  const ws = new WsTransport({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  const heard = [];
  let opened = 0;
  Object.assign(ws, { events: true, onEvent: (m) => heard.push(m), onOpen: () => opened++ });
  await ws.connect();
  const sock = FakeSocket.last;
  assert.equal(sock.url, "ws://x/ws");
  assert.deepEqual(sock.sent, [{ type: "subscribe" }]);
  assert.equal(opened, 1);
  const event = { type: "event", event: "conversation_deleted", conversation_id: "c1" };
  sock.serverSend(event);
  sock.serverSend({ type: "ping" });
  assert.deepEqual(heard, [event]);
  clearTimeout(ws.watchdog);
});

test("WS: a socket for replies only does not subscribe", async () => {
  const ws = new WsTransport({ url: "ws://x/ws", client: {}, WebSocketImpl: FakeSocket });
  await ws.connect();
  assert.deepEqual(FakeSocket.last.sent, []);
  clearTimeout(ws.watchdog);
});

test("a conversation pinned or archived in another tab moves in this tab's list", () => {
  const { list, sync } = setup({ items: [{ id: "c1", title: "Dragons" }] });
  const base = { conversation_id: "c1", title: "Dragons", updated_at: "2026-12-02T12:00:00+00:00" };
  sync.handle({ event: "conversation_filed", ...base, pinned_at: "2026-12-02T13:00:00+00:00", archived_at: null });
  sync.handle({ event: "conversation_filed", ...base, pinned_at: null, archived_at: "2026-12-02T14:00:00+00:00" });
  assert.deepEqual(list.calls, [
    ["filed", "c1", "2026-12-02T13:00:00+00:00", null],
    ["filed", "c1", null, "2026-12-02T14:00:00+00:00"],
  ]);
});

test("signed_out hands the reason to the page (which goes to the log-in page)", () => {
  const signedOut = [];
  const sync = new TabSync({
    conversations: fakeList([]),
    replies: { liveFor: () => null },
    reload() {},
    onGone() {},
    onSignedOut: (reason) => signedOut.push(reason),
  });
  sync.handle({ event: "signed_out", reason: "disabled" });
  assert.deepEqual(signedOut, ["disabled"]);
});
