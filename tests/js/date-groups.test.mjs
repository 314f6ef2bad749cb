// Unit tests for the conversation list's date groups: node --test tests/js/
import { test } from "node:test";
import assert from "node:assert/strict";
import { dateGroup, groupByDate } from "../../static/js/date-groups.js";

test("groups follow local calendar days, not 24-hour spans", () => {
  const now = new Date(2026, 11, 1, 0, 30); // 00:30 local time
  assert.equal(dateGroup(new Date(2026, 11, 1, 0, 5).toISOString(), now), "Today");
  assert.equal(dateGroup(new Date(2026, 10, 30, 23, 59).toISOString(), now), "Yesterday"); // 31 minutes ago
  assert.equal(dateGroup(new Date(2026, 10, 30, 0, 0).toISOString(), now), "Yesterday");
  assert.equal(dateGroup(new Date(2026, 10, 29, 23, 59).toISOString(), now), "Previous 7 days");
  assert.equal(dateGroup(new Date(2026, 10, 24, 12, 0).toISOString(), now), "Previous 7 days");
  assert.equal(dateGroup(new Date(2026, 10, 23, 12, 0).toISOString(), now), "Older");
  assert.equal(dateGroup("not a date", now), "Older");
  assert.equal(dateGroup(new Date(2026, 11, 2, 9).toISOString(), now), "Today"); // a clock ahead of ours
});

test("the time zone decides the day: the same instant is today in one zone and yesterday in another", () => {
  const before = process.env.TZ;
  const instant = "2026-12-01T03:00:00Z";
  const now = new Date("2026-12-01T12:00:00Z");
  try {
    process.env.TZ = "UTC";
    assert.equal(dateGroup(instant, now), "Today");
    process.env.TZ = "America/New_York"; // 22:00 on 30 November there, noon is 07:00 on the 1st
    assert.equal(dateGroup(instant, now), "Yesterday");
  } finally {
    if (before === undefined) delete process.env.TZ;
    else process.env.TZ = before;
  }
});

test("groupByDate keeps the order within groups and leaves empty groups out", () => {
  const now = new Date(2026, 11, 1, 12);
  const at = (d, h) => ({ id: `${d}-${h}`, updated_at: new Date(2026, 11, d, h).toISOString() });
  const items = [at(1, 11), at(1, 9), at(1, 0), new Date(2026, 9, 1)].map((x) =>
    x instanceof Date ? { id: "old", updated_at: x.toISOString() } : x,
  );
  const groups = groupByDate(items, now);
  assert.deepEqual(groups.map(([label, list]) => [label, list.map((c) => c.id)]), [
    ["Today", ["1-11", "1-9", "1-0"]],
    ["Older", ["old"]],
  ]);
});
