/**
 * The open conversation's thread: the views of its stored rows (with the live reply's own views
 * kept in their place), and the versions of its messages as the user edits and switches them
 * (the controls are in branches.js; the server keeps which branch is shown).
 */

import { api, enc } from "./api.js";
import { showVersions } from "./branches.js";
import { MessageView } from "./message-view.js";
import { ReplyState } from "./reply.js";

/** The message elements of a loaded conversation, with its live reply's views in their place. */
export function messageNodes(rows, live) {
  const nodes = [];
  const toResume = [];
  for (const row of rows) {
    const liveView = row.role === "user" ? live?.userView : live?.view;
    if (liveView && liveView.reply.messageId === String(row.id)) nodes.push(liveView.el);
    else if (row.role === "user") {
      const view = new MessageView("user", { text: row.content || "", status: row.status || "completed", messageId: row.id });
      showVersions(view, row.siblings);
      nodes.push(view.el);
    } else if (row.role === "assistant") {
      const view = new MessageView("assistant", ReplyState.fromRow(row));
      showVersions(view, row.siblings);
      nodes.push(view.el);
      if (row.status === "streaming" && !live) toResume.push(view);
    }
  }
  // A reply sent from this page whose rows the server did not list yet.
  if (live && !nodes.includes(live.view.el)) {
    if (live.userView && !nodes.includes(live.userView.el)) nodes.push(live.userView.el);
    nodes.push(live.view.el);
  }
  return { nodes, toResume };
}

/** Edit a message, or show another version of one; `onShown(id, conversation)` redraws. */
export class Versions {
  constructor({ conversations, replies, composer, messages, announce, onShown }) {
    Object.assign(this, { conversations, replies, composer, messages, announce, onShown });
  }

  /** Versions wait for the reply: the page shows one branch, and the live reply is on it. */
  refuseWhileLive(what) {
    if (!this.replies.liveFor(this.conversations.currentId)) return false;
    this.composer.showError(`Wait for the reply to finish (or stop it) before ${what}.`);
    return true;
  }

  edit(view, content) {
    this.composer.showError("");
    const id = this.conversations.currentId;
    if (!id || !content.trim() || this.refuseWhileLive("editing a message")) {
      view.update();
      return;
    }
    this.replies.edit(id, view, content);
  }

  /** Show another version of a message (and the branch below it); the server remembers it. */
  async show(messageId, which) {
    const id = this.conversations.currentId;
    if (!id || this.refuseWhileLive("switching versions")) return;
    this.composer.showError("");
    let data;
    try {
      data = await api.patch(`/api/conversations/${enc(id)}/branch`, { message_id: messageId });
    } catch (err) {
      this.composer.showError(`Could not show that version: ${err.detail || err.message}`);
      return;
    }
    if (id !== this.conversations.currentId) return;
    this.onShown(id, data);
    // Keep the reader where they were: on the message they switched, its same button focused.
    const shown = this.messages.el.querySelector(`[data-message-id="${messageId}"]`);
    shown?.scrollIntoView({ block: "nearest" });
    const buttons = [`[data-testid=branch-${which}]`, "[data-testid=branch-switcher] button"];
    const button = buttons.map((s) => shown?.querySelector(`${s}:not([disabled])`)).find(Boolean);
    button?.focus();
    this.announce(`Showing version ${shown?.querySelector("[data-testid=branch-position]")?.textContent || ""}.`);
  }
}
