/**
 * Keeping conversations: the open one downloads as Markdown or JSON (plain links, the server
 * answers with Content-Disposition: attachment), and a JSON export is imported back as a new
 * conversation. The server validates the file strictly and says what is wrong; that is shown.
 */

import { api, enc } from "./api.js";
import { showError } from "./dom.js";

/** The topbar's export menu, pointed at the open conversation (hidden when none is). */
export class ExportMenu {
  constructor({ menu, markdown, json }) {
    Object.assign(this, { menu, markdown, json });
  }

  show(conversationId) {
    this.menu.hidden = !conversationId;
    this.menu.open = false;
    if (!conversationId) return;
    const base = `/api/conversations/${enc(conversationId)}/export?format=`;
    this.markdown.href = `${base}md`;
    this.json.href = `${base}json`;
  }
}

/** The sidebar's Import: pick a .json file, post it, open the new conversation. */
export class ImportButton {
  /**
   * @param button, file, error  the Import button, its hidden file <input>, its error line
   * @param onImported           (conversation): it is on the server now
   * @param announce             reads a short status out to screen readers
   */
  constructor({ button, file, error, onImported, announce }) {
    Object.assign(this, { file, error, onImported, announce });
    button.addEventListener("click", () => file.click());
    file.addEventListener("change", () => this.upload());
  }

  async upload() {
    const chosen = this.file.files?.[0];
    this.file.value = ""; // the same file can be picked again
    if (!chosen) return;
    showError(this.error, "");
    let parsed;
    try {
      parsed = JSON.parse(await chosen.text());
    } catch {
      showError(this.error, `Could not import “${chosen.name}”: it is not JSON.`);
      return;
    }
    try {
      const created = await api.post("/api/conversations/import", parsed);
      this.announce(`Imported “${created.title}”.`);
      this.onImported(created);
    } catch (err) {
      showError(this.error, `Could not import “${chosen.name}”: ${err.detail || err.message}`);
    }
  }
}
