/**
 * Set a new password with a one-time link: the secret is in the URL's fragment (#token=...), which
 * the browser never sends to a server; it goes in the JSON body of POST /api/auth/reset.
 */

import { api } from "./api.js";
import { showError } from "./dom.js";

const form = document.getElementById("reset-form");
const errorEl = document.getElementById("reset-error");
const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";

if (!token) showError(errorEl, "This link is incomplete: ask the admin for a new one.");

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  showError(errorEl, "");
  const password = form.password.value;
  if (!password) {
    showError(errorEl, "Enter a new password.");
    form.password.focus();
    return;
  }
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    await api.post("/api/auth/reset", { token, password });
    history.replaceState(null, "", location.pathname); // the spent secret leaves the address bar
    document.getElementById("reset-done").hidden = false;
    form.password.value = "";
  } catch (err) {
    const detail = err.detail || "Could not reach the server.";
    showError(errorEl, detail.charAt(0).toUpperCase() + detail.slice(1));
  } finally {
    button.disabled = false;
  }
});
