// Unit tests for the SSE parser: node --test tests/js/
import { test } from "node:test";
import assert from "node:assert/strict";
import { SSEParser, readSSE } from "../../static/js/sse.js";

function parseAll(chunks) {
  const p = new SSEParser();
  const out = [];
  for (const c of chunks) out.push(...p.feed(c));
  p.end();
  return out;
}

/** Every way of cutting `s` into two pieces, plus one-char-at-a-time. */
function splits(s) {
  const ways = [[s], [...s]];
  for (let i = 1; i < s.length; i++) ways.push([s.slice(0, i), s.slice(i)]);
  return ways;
}

const STREAM =
  ": keepalive\n\n" +
  'event: start\nid: 0\ndata: {"message_id":"m1","offset":0}\n\n' +
  'event: delta\nid: 5\ndata: {"text":"Hello"}\n\n' +
  ": keepalive\n\n" +
  'event: delta\nid: 7\ndata: {"text":", "}\n\n' +
  'event: final\nid: 7\ndata: {"status":"completed"}\n\n';

function summary(events) {
  return events.map((e) => `${e.event}#${e.id}:${e.data}`);
}

test("named events with ids; comments are skipped", () => {
  const events = parseAll([STREAM]);
  assert.deepEqual(summary(events), [
    'start#0:{"message_id":"m1","offset":0}',
    'delta#5:{"text":"Hello"}',
    'delta#7:{"text":", "}',
    'final#7:{"status":"completed"}',
  ]);
  assert.ok(events.every((e) => e.hasId));
});

test("any split of the stream gives the same events (LF)", () => {
  const want = summary(parseAll([STREAM]));
  for (const chunks of splits(STREAM)) assert.deepEqual(summary(parseAll(chunks)), want);
});

test("CRLF and lone CR line endings, split at every point (incl. between \\r and \\n)", () => {
  const want = summary(parseAll([STREAM]));
  for (const eol of ["\r\n", "\r"]) {
    const s = STREAM.replaceAll("\n", eol);
    assert.deepEqual(summary(parseAll([s])), want, `eol ${JSON.stringify(eol)}`);
    for (const chunks of splits(s)) assert.deepEqual(summary(parseAll(chunks)), want);
  }
});

test("a \\r at the end of a chunk followed by \\n is one line break, not two", () => {
  const events = parseAll(["data: a\r", "\ndata: b\r", "\n\r", "\n"]);
  assert.deepEqual(events.map((e) => e.data), ["a\nb"]);
});

test("mixed line endings in one stream", () => {
  const events = parseAll(["data: one\r\ndata: two\rdata: three\n\r\n"]);
  assert.deepEqual(events.map((e) => e.data), ["one\ntwo\nthree"]);
});

test("multi-line data is joined with \\n; empty data lines count", () => {
  const events = parseAll(["data: line 1\ndata: line 2\ndata\ndata:\ndata: end\n\n"]);
  assert.equal(events[0].data, "line 1\nline 2\n\n\nend");
});

test("only one leading space is removed from a value; no-space form works", () => {
  const events = parseAll(["data:x\n\n", "data:  two spaces\n\n", "event:delta\ndata: y\n\n"]);
  assert.deepEqual(events.map((e) => [e.event, e.data]), [
    ["message", "x"],
    ["message", " two spaces"],
    ["delta", "y"],
  ]);
});

test("id persists across events; hasId tells whether the block set it", () => {
  const events = parseAll(["id: 3\ndata: a\n\n", "data: b\n\n", "id: 9\ndata: c\n\n"]);
  assert.deepEqual(events.map((e) => [e.id, e.hasId]), [
    ["3", true],
    ["3", false],
    ["9", true],
  ]);
});

test("id with NUL is ignored; retry parsed only when all digits", () => {
  const p = new SSEParser();
  const ev = p.feed("id: 4\ndata: a\n\nid: 5\0\nretry: 1500\ndata: b\n\nretry: 1x\n\n");
  assert.deepEqual(ev.map((e) => e.id), ["4", "4"]);
  assert.equal(p.retry, 1500);
});

test("an event without data is not dispatched, and its event name does not leak", () => {
  const events = parseAll(["event: ping\n\n", "data: real\n\n"]);
  assert.deepEqual(events.map((e) => [e.event, e.data]), [["message", "real"]]);
});

test("comments anywhere, including between fields of one event", () => {
  const events = parseAll([": hello\nevent: delta\n: keepalive\ndata: x\n:\n\n"]);
  assert.deepEqual(events.map((e) => [e.event, e.data]), [["delta", "x"]]);
});

test("unknown fields ignored; a line without colon is a field with empty value", () => {
  const events = parseAll(["foo: bar\ndata\n\n"]);
  assert.deepEqual(events.map((e) => e.data), [""]);
});

test("a stream that ends mid-event drops the incomplete event", () => {
  const events = parseAll(['event: delta\nid: 5\ndata: {"text":"Hello"}\n\nevent: final\ndata: {"status"']);
  assert.deepEqual(events.map((e) => e.event), ["delta"]);
  const events2 = parseAll(["data: complete-looking line\n"]);
  assert.deepEqual(events2, []);
});

test("leading BOM is stripped", () => {
  assert.deepEqual(parseAll(["\ufeffdata: x\n\n"]).map((e) => e.data), ["x"]);
});

function bodyOf(byteChunks) {
  return new ReadableStream({
    start(controller) {
      for (const c of byteChunks) controller.enqueue(c);
      controller.close();
    },
  });
}

async function collect(iter) {
  const out = [];
  for await (const e of iter) out.push(e);
  return out;
}

test("readSSE: UTF-8 characters split across byte chunks decode correctly", async () => {
  const text = 'event: delta\nid: 6\ndata: {"text":"héllo 👋🏽 日本 שלום"}\n\n';
  const bytes = new TextEncoder().encode(text);
  const want = JSON.parse(parseAll([text])[0].data).text;
  for (let i = 1; i < bytes.length; i++) {
    const events = await collect(readSSE(bodyOf([bytes.slice(0, i), bytes.slice(i)])));
    assert.equal(events.length, 1, `split at ${i}`);
    assert.equal(JSON.parse(events[0].data).text, want);
  }
  // one byte at a time
  const singles = [...bytes].map((b) => new Uint8Array([b]));
  const events = await collect(readSSE(bodyOf(singles)));
  assert.equal(JSON.parse(events[0].data).text, want);
});

test("readSSE: onChunk fires for keepalive-only chunks; trailing partial event dropped", async () => {
  let chunks = 0;
  const enc = new TextEncoder();
  const events = await collect(
    readSSE(bodyOf([enc.encode(": keepalive\n\n"), enc.encode("data: a\n\n"), enc.encode("data: b")]), {
      onChunk: () => chunks++,
    }),
  );
  assert.equal(chunks, 3);
  assert.deepEqual(events.map((e) => e.data), ["a"]);
});

test("readSSE: a body that errors mid-stream rejects the iterator after the complete events", async () => {
  const enc = new TextEncoder();
  const body = new ReadableStream({
    pull(controller) {
      if (!this.sent) {
        this.sent = true;
        controller.enqueue(enc.encode("data: a\n\ndata: b"));
      } else {
        controller.error(new TypeError("network error"));
      }
    },
  });
  const got = [];
  await assert.rejects(async () => {
    for await (const e of readSSE(body)) got.push(e.data);
  }, TypeError);
  assert.deepEqual(got, ["a"]);
});
