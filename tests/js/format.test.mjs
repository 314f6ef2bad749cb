// The page's and the admin's one formatting helper (static/js/format.js).
import { test } from "node:test";
import assert from "node:assert/strict";
import { formatDuration, formatTime } from "../../static/js/format.js";

test("durations: ms under 1 s, then seconds with one decimal, then minutes", () => {
  const cases = [
    [0, "0 ms"], [7.4, "7 ms"], [999.4, "999 ms"], [999.6, "1.0 s"], [1000, "1.0 s"], [9832, "9.8 s"],
    [10_000, "10.0 s"], [59_949, "59.9 s"], [59_960, "1 min 0 s"], [61_000, "1 min 1 s"],
    [754_000, "12 min 34 s"], [3_600_000, "1 h 0 min"], [5_430_000, "1 h 30 min"], [-1500, "-1.5 s"],
    ["9832", "9.8 s"],
  ];
  for (const [ms, text] of cases) assert.equal(formatDuration(ms), text, `formatDuration(${ms})`);
  for (const none of [null, undefined, "", "x", NaN, Infinity]) assert.equal(formatDuration(none), null);
});

test("times: local date and time with the zone named", () => {
  const t = "2026-12-01T09:17:07Z";
  assert.equal(formatTime(t, { timeZone: "UTC" }), "2026-12-01 09:17:07 UTC");
  assert.equal(formatTime(new Date(t), { timeZone: "Asia/Tokyo" }), "2026-12-01 18:17:07 GMT+9");
  // The local date, not the UTC one, across midnight; summer time counted.
  assert.match(formatTime("2026-06-30T23:30:00+00:00", { timeZone: "Europe/Paris" }), /^2026-07-01 01:30:00 \S+$/);
  assert.equal(formatTime("not a date"), null);
});
