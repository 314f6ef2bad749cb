// The sidebar's order and page keys (static/js/conversation-list.js) match the server's
// (app/domain/chat/conversations.py): pinned first, newest pin first; then newest activity first.
import { test } from "node:test";
import assert from "node:assert/strict";
import { listOrder, pageAfter } from "../../static/js/conversation-list.js";

const at = (minute) => `2026-12-02T12:${String(minute).padStart(2, "0")}:00+00:00`;

test("pinned ones come first, the newest pin first, then the rest by last activity", () => {
  const items = [
    { id: "a", updated_at: at(50), pinned_at: null },
    { id: "b", updated_at: at(1), pinned_at: at(10) },
    { id: "c", updated_at: at(40), pinned_at: null },
    { id: "d", updated_at: at(2), pinned_at: at(20) },
    { id: "e", updated_at: at(40), pinned_at: null }, // a tie on time: the larger id first
  ];
  assert.deepEqual(items.sort(listOrder).map((c) => c.id), ["d", "b", "a", "e", "c"]);
});

test("the next page is keyed by the last one listed, with its pin when it was pinned", () => {
  const plain = pageAfter({ id: "x y", updated_at: at(5), pinned_at: null });
  assert.equal(plain, `after=${encodeURIComponent(at(5))}&after_id=x%20y`);
  const pinned = pageAfter({ id: "p", updated_at: at(5), pinned_at: at(9) });
  assert.equal(pinned, `after=${encodeURIComponent(at(5))}&after_id=p&after_pinned=${encodeURIComponent(at(9))}`);
});
