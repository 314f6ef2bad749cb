/**
 * The page's routing: which conversation the URL's fragment (`#<id>`) names.
 *
 * The fragment is whatever the address bar holds, so it may be hand-typed or cut short:
 * `#%E0%A4%A` is not valid percent-encoding, and decodeURIComponent throws a URIError on it.
 * Such a fragment names no conversation; it must not break the page.
 */

/** The conversation id in `hash` ("#..." or ""), or "" when it names none. */
export function conversationIdFromHash(hash) {
  const raw = String(hash || "").replace(/^#/, "");
  try {
    return decodeURIComponent(raw);
  } catch (err) {
    if (err instanceof URIError) return "";
    throw err;
  }
}
