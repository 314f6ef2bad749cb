/**
 * The chat settings panel: a conversation's system prompt and sampling settings, and the user's
 * defaults that new conversations start from (GET/PUT /api/conversations/{id}/settings and
 * /api/account/chat-defaults). An empty field means "the default", shown as its placeholder.
 * The server checks every value as it checks a request's (a 400 says what is wrong, shown here).
 */

import { api, enc, request } from "./api.js";
import { $, closeOnDismiss, showError } from "./dom.js";

const NUMBERS = ["temperature", "top_p", "min_p", "max_tokens", "repeat_penalty", "frequency_penalty", "presence_penalty"];
const DEFAULTS_PATH = "/api/account/chat-defaults";

const settingsPath = (id) => `/api/conversations/${enc(id)}/settings`;

export class SettingsPanel {
  /**
   * @param dialog              the <dialog> holding #settings-form
   * @param openButton          opens it
   * @param currentId           () => the open conversation's id, or null
   * @param ensureConversation  async () => the open conversation's id, starting one if needed
   * @param announce            reads a short status out to screen readers
   */
  constructor({ dialog, openButton, currentId, ensureConversation, announce }) {
    this.dialog = dialog;
    this.currentId = currentId;
    this.ensureConversation = ensureConversation;
    this.announce = announce;
    this.form = $("#settings-form", dialog);
    this.error = $("#settings-error", dialog);
    this.scope = $("#settings-scope", dialog);
    this.field = (name) => this.form.elements.namedItem(name);

    openButton.addEventListener("click", () => this.open());
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.save(false);
    });
    $("#settings-save-default", dialog).addEventListener("click", () => this.save(true));
    closeOnDismiss(dialog); // Esc closes a modal <dialog> by itself
  }

  async open() {
    showError(this.error, "");
    this.dialog.showModal();
    const id = this.currentId();
    this.scope.textContent = id
      ? "Used for every reply in this conversation. Leave a field empty for the default."
      : "For the next conversation; new conversations start from your defaults.";
    // Until the stored settings arrive the fields wait: typing into them now would be undone by
    // the fill, and a save would store what the form held before.
    this.setLoading(true);
    try {
      this.fill(await api.get(id ? settingsPath(id) : DEFAULTS_PATH));
    } catch (err) {
      showError(this.error, `Could not load the settings: ${err.detail || err.message}`);
    } finally {
      this.setLoading(false);
      this.field("system_prompt").focus();
    }
  }

  setLoading(busy) {
    this.form.setAttribute("aria-busy", String(busy));
    for (const control of this.dialog.querySelectorAll("input, textarea, button[type=submit], #settings-save-default")) {
      control.disabled = busy;
    }
  }

  /** Show stored settings; the model's defaults are the placeholders of the empty fields. */
  fill({ settings, model_defaults: defaults }) {
    this.field("system_prompt").value = settings.system_prompt || "";
    for (const name of NUMBERS) {
      const input = this.field(name);
      input.value = settings[name] ?? "";
      input.placeholder = defaults[name] == null ? "" : `default ${defaults[name]}`;
    }
    this.field("stop").value = (settings.stop || []).join("\n");
  }

  /** The form as the API's settings: empty fields are null (the default). */
  read() {
    const body = { system_prompt: this.field("system_prompt").value };
    for (const name of NUMBERS) {
      const raw = this.field(name).value.trim();
      body[name] = raw === "" ? null : Number(raw);
    }
    const stops = this.field("stop").value.split("\n").map((s) => s.replace(/\r$/, "")).filter((s) => s !== "");
    body.stop = stops.length ? stops : null;
    return body;
  }

  async save(asDefault) {
    showError(this.error, "");
    const body = this.read();
    try {
      const path = asDefault ? DEFAULTS_PATH : settingsPath(await this.ensureConversation());
      await request(path, { method: "PUT", json: body });
    } catch (err) {
      showError(this.error, err.detail || err.message);
      return;
    }
    this.dialog.close();
    this.announce(asDefault ? "Saved as your default for new chats." : "Settings saved for this chat.");
  }
}
