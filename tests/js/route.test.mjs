// Unit tests for the page's fragment routing: node --test tests/js/
import { test } from "node:test";
import assert from "node:assert/strict";
import { conversationIdFromHash } from "../../static/js/route.js";

test("a fragment names the conversation it holds, percent-decoded", () => {
  const id = "0b5a3c1e-9a7f-4c33-8d0e-2f1f5b7c9a10";
  assert.equal(conversationIdFromHash(`#${id}`), id);
  assert.equal(conversationIdFromHash("#%E0%A4%A4"), "त"); // whole percent-encoding decodes
  assert.equal(conversationIdFromHash(""), "");
  assert.equal(conversationIdFromHash("#"), "");
});

test("a fragment that is not valid percent-encoding names no conversation, and does not throw", () => {
  // decodeURIComponent throws URIError on each of these: a cut-short or hand-typed address.
  for (const hash of ["#%E0%A4%A", "#%", "#%ZZ", "#%E0%A4", "#%ED%A0%80"]) {
    assert.throws(() => decodeURIComponent(hash.slice(1)), URIError, hash);
    assert.equal(conversationIdFromHash(hash), "", hash);
  }
});
