// The page's push channel over `GET /api/events` (static/js/push.js): it reconnects after the
// stream ends, except when the server ended it for good: the account was signed out, or the
// user's newer pages pushed this one out (`resync` with reason "evicted").
import { test } from "node:test";
import assert from "node:assert/strict";
import { SsePush } from "../../static/js/push.js";

/** A client whose every `GET /api/events` answers `body` and ends; counts the requests. */
function client(body) {
  const calls = [];
  return {
    calls,
    async fetchRaw(path) {
      calls.push(path);
      return new Response(body, { headers: { "content-type": "text/event-stream" } });
    },
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function run(body, waitMs = 900) {
  const http = client(body);
  const events = [];
  const push = new SsePush({ client: http, onEvent: (ev) => events.push(ev), onConnected() {} });
  push.start();
  await sleep(waitMs); // past the first reconnect's backoff (at most 625 ms)
  push.stop();
  return { requests: http.calls.length, events };
}

test("a stream that simply ends is reconnected", async () => {
  const { requests, events } = await run('event: resync\ndata: {"event":"resync"}\n\n');
  assert.ok(requests >= 2, `requests: ${requests}`);
  assert.deepEqual(events[0], { event: "resync" });
});

test("after `signed_out` the channel is not reconnected", async () => {
  const body = 'event: signed_out\ndata: {"event":"signed_out","reason":"disabled"}\n\n';
  const { requests, events } = await run(body);
  assert.equal(requests, 1);
  assert.deepEqual(events, [{ event: "signed_out", reason: "disabled" }]);
});

test("a channel pushed out by the user's newer pages is not reconnected", async () => {
  const body = 'event: resync\ndata: {"event":"resync","reason":"evicted"}\n\n';
  const { requests, events } = await run(body);
  assert.equal(requests, 1);
  assert.deepEqual(events, [{ event: "resync", reason: "evicted" }]);
});
