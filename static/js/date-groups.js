/**
 * Conversations grouped by when they were last active, in the browser's own time zone: today,
 * yesterday, the previous 7 days, older. Calendar days, not 24-hour spans: "yesterday" starts at
 * the local midnight before last, whatever the hour now.
 */

export const GROUPS = ["Today", "Yesterday", "Previous 7 days", "Older"];

function localMidnight(date) {
  return new Date(date.getFullYear(), date.getMonth(), date.getDate());
}

/** The group of an ISO timestamp, seen at `now` (local time). */
export function dateGroup(iso, now = new Date()) {
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return "Older";
  const today = localMidnight(now);
  // Whole local days between the two midnights (Math.round: a DST change makes a day 23 or 25 h).
  const days = Math.round((today - localMidnight(when)) / 86_400_000);
  if (days <= 0) return "Today";
  if (days === 1) return "Yesterday";
  if (days <= 7) return "Previous 7 days";
  return "Older";
}

/** [[label, items], ...] in GROUPS order, empty groups left out; items keep their order. */
export function groupByDate(items, now = new Date(), key = (c) => c.updated_at) {
  const groups = new Map(GROUPS.map((g) => [g, []]));
  for (const item of items) groups.get(dateGroup(key(item), now)).push(item);
  return [...groups].filter(([, list]) => list.length > 0);
}
