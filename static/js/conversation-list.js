/**
 * The conversation list in the sidebar: the user's conversations, newest first, which one is
 * open, a dot on those with a reply streaming, and rename (in place) and delete (after a confirm
 * dialog) through the API. Opening one, and what a delete means for the open conversation, are
 * the page's (hooks).
 */

import { api, enc } from "./api.js";
import { groupByDate } from "./date-groups.js";
import { $, closeOnDismiss, h, icon } from "./dom.js";

export const DEFAULT_TITLE = "New chat";
const PAGE = 100; // conversations per page of GET /api/conversations (its default)

export function conversationTitle(c) {
  return (c && c.title) || DEFAULT_TITLE;
}

export class ConversationList {
  /**
   * @param list, empty  the <ul> and its "No conversations yet" line
   * @param older        the "Show older conversations" button below it (it also loads itself as
   *                     it nears the bottom of the scrolled list)
   * @param confirm      the delete confirmation <dialog> (#confirm-text, #confirm-delete inside)
   * @param isLive       (id) => true while a reply streams in that conversation
   * @param announce     reads a short status out to screen readers
   * @param onOpen       (id): the user picked a conversation
   * @param onTitle      (conversation): its title changed
   * @param onDeleting   (conversation): about to delete it (stop its reply)
   * @param onDeleted    (conversation): it is gone from the server and the list
   */
  constructor({ list, empty, older, confirm, isLive, announce, onOpen, onTitle, onDeleting, onDeleted }) {
    Object.assign(this, { list, empty, older, confirm, isLive, announce, onOpen, onTitle, onDeleting, onDeleted });
    this.items = []; // [{id, title, created_at, updated_at}], newest first
    this.hasOlder = false; // the server has older ones than the last listed
    older.addEventListener("click", () => this.loadOlder());
    this.nearEnd = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.loadOlder();
    }, { root: older.parentElement, rootMargin: "0px 0px 400px 0px" });
    this.nearEnd.observe(older);
    this.currentId = null;
    this.pendingDelete = null;
    closeOnDismiss(confirm);
    $("#confirm-delete", confirm).addEventListener("click", () => this.deleteConfirmed());
  }

  find(id) {
    return this.items.find((c) => c.id === id);
  }

  /** The newest page of the user's conversations; the rest come as the list is scrolled. */
  async load() {
    this.items = (await api.get("/api/conversations")) || [];
    this.hasOlder = this.items.length >= PAGE;
  }

  /** The next page: the conversations after the last one listed (keyed by it, not an offset). */
  async loadOlder() {
    if (!this.hasOlder || this.loadingOlder) return;
    const last = this.items.at(-1);
    this.loadingOlder = true;
    try {
      const query = `after=${enc(last.updated_at)}&after_id=${enc(last.id)}&limit=${PAGE}`;
      const page = (await api.get(`/api/conversations?${query}`)) || [];
      this.items.push(...page.filter((c) => !this.find(c.id)));
      this.hasOlder = page.length >= PAGE;
      this.render();
      // Observed afresh: if the button is still in sight (a tall list), that loads the next page.
      this.nearEnd.unobserve(this.older);
      this.nearEnd.observe(this.older);
    } catch (err) {
      this.announce(`Could not load older conversations: ${err.detail || err.message}`);
    } finally {
      this.loadingOlder = false;
    }
  }

  /** A conversation started on this page, or another of the user's (it goes on top, once). */
  add(c) {
    this.forget(c.id);
    this.items.unshift(c);
  }

  forget(id) {
    this.items = this.items.filter((c) => c.id !== id);
  }

  /** A reply started in this conversation: move it to the top, and pick up the server's title. */
  touch(id, content) {
    const idx = this.items.findIndex((c) => c.id === id);
    if (idx === -1) return;
    const [c] = this.items.splice(idx, 1);
    c.updated_at = new Date().toISOString();
    this.items.unshift(c);
    this.render();
    // The server named a new chat from this first message (distinct from the user's other chats,
    // app/domain/chat/conversations.py): show its name.
    if (content && (!c.title || c.title === DEFAULT_TITLE)) this.refreshTitle(c);
  }

  async refreshTitle(c) {
    try {
      const fresh = await api.get(`/api/conversations/${enc(c.id)}`);
      if (!fresh?.title || fresh.title === c.title) return;
      c.title = fresh.title;
      this.render();
      this.onTitle(c);
    } catch {
      /* the list shows the old title until the next load */
    }
  }

  render() {
    const row = (c) => {
      const title = conversationTitle(c);
      const current = c.id === this.currentId;
      const link = h(
        "a",
        {
          class: "conv-link", href: `#${c.id}`, "data-testid": "conversation-link",
          "aria-current": current ? "page" : null,
          onclick: (e) => {
            e.preventDefault();
            this.onOpen(c.id);
          },
        },
        h("span", { class: "conv-title-text", title }, title), // the whole title on hover
      );
      const item = h(
        "li",
        { class: `conversation${current ? " is-current" : ""}`, "data-testid": "conversation", "data-conversation-id": c.id },
        link,
        h("span", { class: "live-dot", "aria-hidden": "true", title: "Replying" }),
        h("span", { class: "conv-actions" },
          h("button", { type: "button", class: "btn btn-icon btn-small", "data-testid": "rename-conversation", "aria-label": `Rename “${title}”`, title: "Rename", onclick: () => this.startRename(item, c) }, icon("pencil")),
          h("button", { type: "button", class: "btn btn-icon btn-small", "data-testid": "delete-conversation", "aria-label": `Delete “${title}”`, title: "Delete", onclick: () => this.confirmDelete(c) }, icon("trash")),
        ),
      );
      if (this.isLive(c.id)) item.classList.add("is-streaming");
      return item;
    };
    // Grouped by last activity, in the browser's time zone (date-groups.js).
    const items = groupByDate(this.items).flatMap(([label, group]) => [
      h("li", { class: "conv-group", "data-testid": "conversation-group" }, label),
      ...group.map(row),
    ]);
    // Keyboard users keep their place: the control that had focus is focused again in the new list.
    const had = this.list.contains(document.activeElement) && document.activeElement;
    const again = had && [had.closest("[data-conversation-id]")?.dataset.conversationId, had.dataset.testid];
    this.list.replaceChildren(...items);
    this.empty.hidden = this.items.length > 0;
    this.older.hidden = !this.hasOlder;
    if (again) this.list.querySelector(`[data-conversation-id="${CSS.escape(again[0] || "")}"] [data-testid="${again[1]}"]`)?.focus();
  }

  /** The dot on each conversation whose reply is streaming. */
  markStreaming() {
    for (const item of this.list.children) {
      item.classList.toggle("is-streaming", this.isLive(item.dataset.conversationId));
    }
  }

  showLoadError(text) {
    this.empty.textContent = text;
    this.empty.hidden = false;
  }

  startRename(item, c) {
    const input = h("input", {
      class: "rename-input", "data-testid": "rename-input", "aria-label": "New title", maxlength: "500",
    });
    input.value = conversationTitle(c);
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title && title !== c.title) {
        try {
          const updated = await api.patch(`/api/conversations/${enc(c.id)}`, { title });
          c.title = updated?.title ?? title;
          this.onTitle(c);
          this.announce("Conversation renamed.");
        } catch (err) {
          this.announce(`Could not rename: ${err.detail || err.message}`);
        }
      }
      this.render();
      this.list.querySelector(`[data-conversation-id="${CSS.escape(c.id)}"] [data-testid=rename-conversation]`)?.focus();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        finish(true);
      } else if (e.key === "Escape") {
        e.preventDefault();
        e.stopPropagation();
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }

  confirmDelete(c) {
    this.pendingDelete = c;
    $("#confirm-text", this.confirm).textContent = `“${conversationTitle(c)}” and all its messages will be deleted.`;
    this.confirm.showModal();
    $("#confirm-delete", this.confirm).focus();
  }

  async deleteConfirmed() {
    const c = this.pendingDelete;
    this.confirm.close();
    if (!c) return;
    this.pendingDelete = null;
    this.onDeleting(c);
    try {
      await api.del(`/api/conversations/${enc(c.id)}`);
    } catch (err) {
      if (err.status !== 404) {
        this.announce(`Could not delete: ${err.detail || err.message}`);
        return;
      }
    }
    this.forget(c.id);
    this.render();
    this.announce("Conversation deleted.");
    this.onDeleted(c);
  }
}
