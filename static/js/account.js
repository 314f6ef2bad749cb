/**
 * The account dialog and log-out: the user's API keys (for /v1), made, listed and revoked
 * through the API. A new key's secret is shown once, and wiped from the page when the dialog
 * closes.
 */

import { api, enc } from "./api.js";
import { $, closeOnDismiss, copyText, flash, h, showError } from "./dom.js";

export class AccountDialog {
  /**
   * @param dialog      the <dialog> (#key-form, #key-list, #new-key… inside)
   * @param openButton  opens it
   * @param logout      the log-out button
   * @param announce    reads a short status out to screen readers
   */
  constructor({ dialog, openButton, logout, announce }) {
    this.dialog = dialog;
    this.announce = announce;
    const el = (selector) => $(selector, dialog);
    this.els = {
      list: el("#key-list"),
      empty: el("#keys-empty"),
      error: el("#keys-error"),
      name: el("#key-name"),
      newKey: el("#new-key"),
      secret: el("#new-key-secret"),
    };

    openButton.addEventListener("click", () => {
      this.forgetNewKey();
      dialog.showModal();
      this.loadKeys();
    });
    el("#key-form").addEventListener("submit", (e) => this.createKey(e));
    el("#copy-key").addEventListener("click", async (e) => {
      flash(e.currentTarget, (await copyText(this.els.secret.textContent)) ? "Copied" : "Copy failed");
    });
    closeOnDismiss(dialog);
    // The secret is shown once: do not leave it in the page. "close" arrives as a later task,
    // after the dialog is already hidden; Esc fires "cancel" first, synchronously, so wipe on both.
    dialog.addEventListener("cancel", () => this.forgetNewKey());
    dialog.addEventListener("close", () => this.forgetNewKey());
    logout.addEventListener("click", logOut);
  }

  get open() {
    return this.dialog.open;
  }

  forgetNewKey() {
    this.els.secret.textContent = "";
    this.els.newKey.hidden = true;
  }

  showKeysError(text) {
    showError(this.els.error, text);
  }

  showEmpty() {
    this.els.empty.hidden = this.els.list.children.length > 0;
  }

  keyItem(k) {
    const created = k.created_at ? new Date(k.created_at).toLocaleDateString() : "";
    const used = k.last_used_at ? `last used ${new Date(k.last_used_at).toLocaleDateString()}` : "never used";
    const item = h(
      "li",
      { class: "key-item", "data-testid": "key-item", "data-key-id": k.id },
      h("span", { class: "key-name" }, k.name || "API key"),
      h("code", { class: "key-prefix", title: "The start of the key" }, `${k.prefix || ""}…`),
      h("span", { class: "muted key-dates" }, [created && `created ${created}`, used].filter(Boolean).join(" · ")),
      h("button", {
        type: "button", class: "btn btn-small btn-danger", "data-testid": "revoke-key", "aria-label": `Revoke key “${k.name || k.prefix}”`,
        onclick: (e) => this.revoke(k, item, e.currentTarget),
      }, "Revoke"),
    );
    return item;
  }

  async revoke(k, item, button) {
    button.disabled = true;
    try {
      await api.del(`/api/keys/${enc(k.id)}`);
      item.remove();
      this.showEmpty();
      this.announce("Key revoked.");
      this.els.name.focus();
    } catch (err) {
      button.disabled = false;
      this.showKeysError(`Could not revoke: ${err.detail || err.message}`);
    }
  }

  async loadKeys() {
    this.showKeysError("");
    try {
      const keys = (await api.get("/api/keys")) || [];
      this.els.list.replaceChildren(...keys.filter((k) => !k.revoked_at).map((k) => this.keyItem(k)));
    } catch (err) {
      this.showKeysError(`Could not load keys: ${err.detail || err.message}`);
    }
    this.showEmpty();
  }

  async createKey(e) {
    e.preventDefault();
    this.showKeysError("");
    const { name, secret } = this.els;
    const button = e.submitter || e.currentTarget.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const key = await api.post("/api/keys", { name: name.value.trim() || "API key" });
      secret.textContent = key.secret;
      this.els.newKey.hidden = false;
      this.els.list.prepend(this.keyItem(key));
      this.els.empty.hidden = true;
      name.value = "";
      secret.focus();
    } catch (err) {
      this.showKeysError(`Could not create a key: ${err.detail || err.message}`);
    } finally {
      button.disabled = false;
    }
  }
}

async function logOut() {
  try {
    await api.post("/api/auth/logout", {});
  } catch {
    /* logged out or not, leave */
  }
  location.assign("/login");
}
