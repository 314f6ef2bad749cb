/**
 * Leaving the chat for the log-in page when the session ends while the page is open: the account
 * was disabled, deleted, its password reset or logged out everywhere (the push channel's
 * `signed_out`, the WebSocket's 4401 close), or the session simply expired (any 401). After a
 * sign-out the server has stopped the replies and sent their ends: the page shows them stopped
 * for a moment (`data-signed-out` on the root), then the log-in page.
 */

import { setUnauthorizedHandler } from "./api.js";

const PAUSE_MS = 1500;

export function goToLogin() {
  const next = encodeURIComponent(location.pathname + location.hash);
  location.assign(`/login?next=${next}`);
}

/** Wire the page's 401s to the log-in page; returns `signedOut(reason)` for the channels. */
export function leaveWhenSignedOut({ root, announce }) {
  // Once signed out, the log-in page is coming already: a 401 meanwhile changes nothing.
  setUnauthorizedHandler(() => (root.dataset.signedOut ? undefined : goToLogin()));
  return function signedOut(reason = "session") {
    if (root.dataset.signedOut) return; // already on its way
    root.dataset.signedOut = reason;
    announce("You have been signed out. Taking you to the log-in page.");
    setTimeout(goToLogin, PAUSE_MS);
  };
}
