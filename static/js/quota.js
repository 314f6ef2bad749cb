/**
 * The token-quota notice under the composer: shown only when less than a tenth of the day's or
 * the month's quota is left (GET /api/quota), refreshed on load and after each reply ends. A send
 * refused because the quota is used up says so through the composer's error line (the server's
 * message names when it resets).
 */

import { api } from "./api.js";

const TIME = { hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZone: "UTC", timeZoneName: "short" };
const DATE = { month: "short", day: "numeric", timeZone: "UTC" };

function resetsText(iso, withDate) {
  const at = new Date(iso);
  const time = at.toLocaleTimeString(undefined, TIME);
  return withDate ? `${at.toLocaleDateString(undefined, DATE)} ${time}` : time;
}

/** The notice's text for a GET /api/quota answer; "" when nothing is low. */
export function quotaNotice(q) {
  if (!q || !q.low) return "";
  const parts = [];
  if (q.left_day != null && q.left_day < 0.1 * q.per_day) {
    parts.push(`${q.left_day.toLocaleString()} of your ${q.per_day.toLocaleString()} tokens left today (resets ${resetsText(q.day_resets_at, false)})`);
  }
  if (q.left_month != null && q.left_month < 0.1 * q.per_month) {
    parts.push(`${q.left_month.toLocaleString()} of your ${q.per_month.toLocaleString()} tokens left this month (resets ${resetsText(q.month_resets_at, true)})`);
  }
  return parts.join(" · ");
}

/** Keep `el` (a hidden paragraph) showing the notice. */
export function watchQuota(el) {
  let inFlight = null;
  const refresh = () => {
    inFlight ??= api
      .get("/api/quota")
      .then((q) => {
        const text = quotaNotice(q);
        el.textContent = text;
        el.hidden = !text;
      })
      .catch(() => {})
      .finally(() => {
        inFlight = null;
      });
    return inFlight;
  };
  document.addEventListener("reply-ended", refresh);
  return refresh();
}
