/**
 * How the page and the admin console write durations and times (one helper for both, so the same
 * figure reads the same everywhere).
 *   formatDuration(9832) -> "9.8 s": ms under a second, then seconds with one decimal, then min.
 *   formatTime(date)     -> "2026-12-01 10:17:07 GMT+1": the viewer's local time, its zone named.
 */

/** A duration in milliseconds as people read it; null when there is none. */
export function formatDuration(ms) {
  if (ms == null || ms === "" || !Number.isFinite(Number(ms))) return null;
  const n = Number(ms);
  if (n < 0) return `-${formatDuration(-n)}`;
  if (Math.round(n) < 1000) return `${Math.round(n)} ms`;
  const tenths = Math.round(n / 100);
  if (tenths < 600) return `${(tenths / 10).toFixed(1)} s`;
  const s = Math.round(n / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/**
 * A moment as "YYYY-MM-DD HH:MM:SS ZONE" in the viewer's time zone (or `timeZone`), with the
 * zone's short name (e.g. "UTC", "GMT+1"); null for an invalid date.
 */
export function formatTime(value, { timeZone } = {}) {
  const date = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(date.getTime())) return null;
  const parts = new Intl.DateTimeFormat("en-GB", {
    timeZone,
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
    timeZoneName: "short",
  }).formatToParts(date);
  const p = Object.fromEntries(parts.map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}`;
}

/** The viewer's time zone by its name (e.g. "Europe/Paris"), for a tooltip. */
export function timeZoneName() {
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
}
