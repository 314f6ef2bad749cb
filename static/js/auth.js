/**
 * Log-in and sign-up: post the form as JSON to /api/auth/{login,signup} (with the CSRF header),
 * then go to `?next=` (pages of this site only) or the chat. An invitation link's secret is in the
 * sign-up page's fragment (#invite=...), which the browser never sends; it goes in the JSON body.
 */

import { api } from "./api.js";
import { showError } from "./dom.js";

const form = document.getElementById("auth-form");
const errorEl = document.getElementById("auth-error");
const mode = form.dataset.mode === "signup" ? "signup" : "login";
/** The invitation in the address's fragment, read when the form is sent: a link pasted over
 * this page only changes the fragment, which does not load the page again. */
const invitation = () => new URLSearchParams(location.hash.slice(1)).get("invite");

/**
 * Where to go after logging in: `?next=` only when it is a page of this site. It is parsed as
 * the navigation will parse it (the URL parser drops tabs and newlines and takes a backslash for
 * a slash, so "/<tab>/evil.example" is "//evil.example") and the result is used whole: an
 * absolute URL of this origin (a bare path could still begin with "//" after "/x/.." collapses).
 */
function nextUrl() {
  const raw = new URLSearchParams(location.search).get("next");
  if (!raw) return "/";
  let url;
  try {
    url = new URL(raw, location.origin);
  } catch {
    return "/";
  }
  return url.origin === location.origin ? url.href : "/";
}

function explain(err) {
  if (err.status === 401) return "Wrong email or password.";
  if (err.status === 429) return "Too many attempts. Wait a moment and try again.";
  if (err.status === 409) return "An account with this email already exists. Log in instead?";
  if (err.status === 403 && mode === "login") return "This account is disabled. Ask an admin.";
  if (err.status >= 500) return "The server had a problem. Try again in a moment.";
  if (err.status) return err.detail.charAt(0).toUpperCase() + err.detail.slice(1);
  return "Could not reach the server. Check your connection.";
}

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  showError(errorEl, "");
  const email = form.email.value.trim();
  const password = form.password.value;
  if (!email || !password) {
    showError(errorEl, "Enter your email and password.");
    (email ? form.password : form.email).focus();
    return;
  }
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  form.setAttribute("aria-busy", "true");
  try {
    const invite = mode === "signup" ? invitation() : null;
    const body = invite ? { email, password, invite } : { email, password };
    await api.post(`/api/auth/${mode}`, body);
    location.assign(nextUrl());
  } catch (err) {
    showError(errorEl, explain(err));
    form.password.select();
    form.password.focus();
  } finally {
    button.disabled = false;
    form.removeAttribute("aria-busy");
  }
});
