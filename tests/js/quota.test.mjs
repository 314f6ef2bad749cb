// The low-quota notice under the composer (static/js/quota.js): shown only below a tenth left.
import { test } from "node:test";
import assert from "node:assert/strict";
import { quotaNotice } from "../../static/js/quota.js";

const base = {
  per_day: 10_000, per_month: null, used_day: 0, used_month: 0, left_day: 10_000, left_month: null,
  day_resets_at: "2026-12-03T00:00:00+00:00", month_resets_at: "2027-01-01T00:00:00+00:00", low: false,
};

test("nothing is said while plenty is left, or with no limit", () => {
  assert.equal(quotaNotice(base), "");
  assert.equal(quotaNotice({ ...base, per_day: null, left_day: null }), "");
  assert.equal(quotaNotice(null), "");
});

test("under a tenth left: how much, of how much, and when it resets (UTC)", () => {
  const text = quotaNotice({ ...base, used_day: 9_500, left_day: 500, low: true });
  assert.match(text, /^500 of your 10,000 tokens left today \(resets 0?0:00 UTC\)$/);
  const month = quotaNotice({ ...base, per_month: 100_000, used_month: 99_990, left_month: 10, low: true });
  assert.match(month, /^10 of your 100,000 tokens left this month \(resets Jan 1,? 0?0:00 UTC\)$/);
  assert.match(quotaNotice({ ...base, left_day: 0, low: true }), /^0 of your/);
});
