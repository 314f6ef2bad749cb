/**
 * The account page: change the password, list the browsers logged in (log one out, or all the
 * others), export and import every conversation, see which admin looked at which conversation,
 * delete the account. Everything goes through /api/account (the CSRF header on each write, by
 * api.js); what the server sends is shown as text only (h() makes text nodes).
 */

import { api, enc, setUnauthorizedHandler } from "./api.js";
import { $, announcer, h, showError } from "./dom.js";
import { formatTime } from "./format.js";

const announce = announcer($("#account-status"));
setUnauthorizedHandler(() => location.assign("/login"));

const when = (iso) => h("time", { datetime: iso }, formatTime(iso) || iso);
const capitalised = (text) => text.charAt(0).toUpperCase() + text.slice(1);
const problem = (err) => capitalised(err.detail || err.message || "Could not reach the server.");

// ---- password --------------------------------------------------------------------------------

const passwordForm = $("#password-form");
passwordForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  const error = $("#password-error");
  const done = $("#password-done");
  showError(error, "");
  done.hidden = true;
  const current = passwordForm.current.value;
  const next = passwordForm.next.value;
  if (!current || !next) {
    showError(error, "Enter your current password and a new one.");
    (current ? passwordForm.next : passwordForm.current).focus();
    return;
  }
  const button = passwordForm.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    await api.post("/api/account/password", { current_password: current, new_password: next });
    passwordForm.reset();
    done.hidden = false;
    announce("Password changed.");
    loadSessions();
  } catch (err) {
    showError(error, problem(err));
  } finally {
    button.disabled = false;
  }
});

// ---- sessions --------------------------------------------------------------------------------

function sessionRow(session) {
  const browser = h("td", { title: session.user_agent }, session.browser);
  if (session.current) browser.append(h("span", { class: "badge-current" }, "this browser"));
  const action = session.current
    ? h("td", {})
    : h(
        "td",
        {},
        h(
          "button",
          {
            type: "button",
            class: "btn btn-small",
            "data-testid": "end-session",
            "aria-label": `Log out ${session.browser} (${session.address})`,
            onclick: () => endSession(session),
          },
          "Log out",
        ),
      );
  return h(
    "tr",
    { "data-testid": "session-row", "data-current": session.current ? "true" : "false", "data-session-id": session.id },
    browser,
    h("td", { "data-label": "Address" }, session.address || "–"),
    h("td", { "data-label": "Logged in" }, when(session.created_at)),
    h("td", { "data-label": "Last seen" }, when(session.last_seen_at)),
    action,
  );
}

async function loadSessions() {
  const error = $("#sessions-error");
  try {
    const sessions = await api.get("/api/account/sessions");
    $("#session-rows").replaceChildren(...sessions.map(sessionRow));
    $("#end-others").disabled = !sessions.some((s) => !s.current);
    showError(error, "");
  } catch (err) {
    showError(error, problem(err));
  }
}

async function endSession(session) {
  try {
    await api.del(`/api/account/sessions/${enc(session.id)}`);
    announce(`${session.browser} is logged out.`);
  } catch (err) {
    showError($("#sessions-error"), problem(err));
  }
  loadSessions();
}

$("#end-others").addEventListener("click", async () => {
  try {
    const { ended } = await api.post("/api/account/sessions/end-others");
    announce(ended === 1 ? "1 other session is logged out." : `${ended} other sessions are logged out.`);
  } catch (err) {
    showError($("#sessions-error"), problem(err));
  }
  loadSessions();
});

// ---- export and import -----------------------------------------------------------------------

const importFile = $("#import-all-file");
$("#import-all").addEventListener("click", () => importFile.click());
importFile.addEventListener("change", async () => {
  const chosen = importFile.files?.[0];
  importFile.value = ""; // the same file can be picked again
  const error = $("#import-error");
  const done = $("#import-done");
  showError(error, "");
  done.hidden = true;
  if (!chosen) return;
  let parsed;
  try {
    parsed = JSON.parse(await chosen.text());
  } catch {
    showError(error, `Could not import “${chosen.name}”: it is not JSON.`);
    return;
  }
  try {
    const created = await api.post("/api/account/import", parsed);
    done.textContent = created.length === 1 ? "Imported 1 conversation." : `Imported ${created.length} conversations.`;
    done.hidden = false;
    announce(done.textContent);
  } catch (err) {
    showError(error, `Could not import “${chosen.name}”: ${err.detail || err.message}`);
  }
});

// ---- who looked ------------------------------------------------------------------------------

const ACTIONS = { view_conversation: "opened", export_conversation: "exported" };

function lookRow(look) {
  const title = look.conversation_title ?? (look.conversation_id ? "(deleted since)" : "–");
  return h(
    "tr",
    { "data-testid": "look-row" },
    h("td", {}, when(look.at)),
    h("td", { "data-testid": "look-admin", "data-label": "Admin" }, look.admin_email),
    h("td", { "data-label": "What" }, ACTIONS[look.action] || look.action),
    h("td", { "data-testid": "look-conversation", "data-label": "Conversation" }, title),
  );
}

async function loadLooks() {
  try {
    const looks = await api.get("/api/account/views");
    $("#look-rows").replaceChildren(...looks.map(lookRow));
    $("#looks-empty").hidden = looks.length > 0;
  } catch {
    /* the list stays empty; the page's other parts still work */
  }
}

// ---- delete ----------------------------------------------------------------------------------

const deleteForm = $("#delete-form");
deleteForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  const error = $("#delete-error");
  showError(error, "");
  const password = deleteForm.password.value;
  if (!password) {
    showError(error, "Enter your password to delete your account.");
    deleteForm.password.focus();
    return;
  }
  if (!confirm("Delete your account and everything in it, for good?")) return;
  const button = deleteForm.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    await api.post("/api/account/delete", { password });
    location.assign("/login");
  } catch (err) {
    showError(error, problem(err));
    button.disabled = false;
  }
});

loadSessions();
loadLooks();
