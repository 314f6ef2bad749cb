/**
 * The page an account waiting for approval sees: ask every few seconds whether an admin said
 * yes (GET /api/me answers 200 then), and go on to the chat when one did. Log out is a JSON post.
 */

import { api } from "./api.js";

const POLL_MS = 5000;

async function check() {
  try {
    await api.get("/api/me");
    location.assign("/");
    return;
  } catch {
    /* still pending (401), or the server is away for a moment: ask again later */
  }
  setTimeout(check, POLL_MS);
}

document.getElementById("waiting-logout").addEventListener("submit", async (e) => {
  e.preventDefault();
  try {
    await api.post("/api/auth/logout");
  } finally {
    location.assign("/login");
  }
});

setTimeout(check, POLL_MS);
