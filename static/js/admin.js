/**
 * Admin live view: refresh the table of running replies every 2 s (pausable), without a full
 * reload. The fresh table comes from the same server-rendered, autoescaped page, parsed inertly
 * by DOMParser (no scripts run) and swapped in; no model text is ever parsed as markup here.
 */

const region = document.querySelector("[data-live-region]");
const toggle = document.getElementById("auto-refresh");
let busy = false;

async function refresh() {
  if (!region || !toggle?.checked || busy || document.hidden) return;
  // Do not pull the table from under a Kill click.
  if (region.contains(document.activeElement) && document.activeElement.matches("button")) return;
  busy = true;
  try {
    const res = await fetch(location.pathname, { credentials: "same-origin", cache: "no-store" });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.querySelector("[data-live-region]");
    if (fresh) region.replaceChildren(...[...fresh.childNodes].map((n) => document.importNode(n, true)));
  } catch {
    /* try again next tick */
  } finally {
    busy = false;
  }
}

for (const form of document.querySelectorAll(".kill-form")) {
  form.addEventListener("submit", () => {
    busy = true; // the page is about to be replaced by the redirect
  });
}

setInterval(refresh, 2000);
