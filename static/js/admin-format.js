/**
 * The admin console's times and durations, as the chat page writes them (format.js): each
 * <time datetime> (written in UTC by the server) in the viewer's own zone, named, with the zone's
 * full name on hover; each [data-ms] as "9.8 s". Also for the rows the live view swaps in.
 */

import { formatDuration, formatTime, timeZoneName } from "./format.js";

function formatIn(root) {
  for (const el of root.querySelectorAll("time[datetime]:not([data-local])")) {
    const text = formatTime(el.getAttribute("datetime"));
    if (!text) continue;
    el.title = `${el.textContent} (your time zone: ${timeZoneName()})`;
    el.textContent = text;
    el.dataset.local = "1";
  }
  for (const el of root.querySelectorAll("[data-ms]:not([data-formatted])")) {
    const text = formatDuration(el.dataset.ms);
    if (!text) continue;
    el.title = `${Math.round(Number(el.dataset.ms))} ms`;
    el.textContent = text;
    el.dataset.formatted = "1";
  }
}

formatIn(document);
new MutationObserver(() => formatIn(document)).observe(document.body, { childList: true, subtree: true });
