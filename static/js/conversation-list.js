/**
 * The conversation list in the sidebar: the user's conversations, the pinned ones first (newest
 * pin first), then the others, newest first; which one is open, a dot on those with a reply
 * streaming, and rename (in place), delete (after a confirm dialog), pin and archive (each item's
 * menu, conversation-menu.js) through the API. Two views of the same list element: the
 * conversations, and the archived ones ("Archived"), each loaded a page at a time as it is
 * scrolled. Opening one, and what a delete means for the open conversation, are the page's (hooks).
 */

import { api, enc } from "./api.js";
import { groupByDate } from "./date-groups.js";
import { conversationMenu } from "./conversation-menu.js";
import { $, closeOnDismiss, h, icon } from "./dom.js";

export const DEFAULT_TITLE = "New chat";
const PAGE = 100; // conversations per page of GET /api/conversations (its default)

export function conversationTitle(c) {
  return (c && c.title) || DEFAULT_TITLE;
}

const EMPTY = { active: "No conversations yet.", archived: "No archived conversations." };

function newestFirst(a, b) {
  return Date.parse(b) - Date.parse(a);
}

/** The server's order (app/domain/chat/conversations.py): pinned first, by pin, newest first;
 * then by last activity, newest first; ties by id, descending. Negative: `a` comes first. */
export function listOrder(a, b) {
  if (!!a.pinned_at !== !!b.pinned_at) return a.pinned_at ? -1 : 1;
  const by = a.pinned_at ? newestFirst(a.pinned_at, b.pinned_at) : newestFirst(a.updated_at, b.updated_at);
  return by || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}

/** The query that asks for the page after `last` (keyed by it, not an offset). */
export function pageAfter(last) {
  const key = `after=${enc(last.updated_at)}&after_id=${enc(last.id)}`;
  return last.pinned_at ? `${key}&after_pinned=${enc(last.pinned_at)}` : key;
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
  constructor({ list, empty, older, archivedToggle, confirm, isLive, announce, onOpen, onTitle, onFiled, onDeleting, onDeleted }) {
    Object.assign(this, { list, empty, older, archivedToggle, confirm, isLive, announce, onOpen, onTitle, onFiled, onDeleting, onDeleted });
    // Each view's loaded pages: [{id, title, created_at, updated_at, pinned_at, archived_at}] in
    // the server's order, and whether the server has more after the last one.
    this.views = { active: { items: [], hasOlder: false }, archived: { items: [], hasOlder: false, loaded: false } };
    this.view = "active";
    older.addEventListener("click", () => this.loadOlder());
    this.nearEnd = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.loadOlder();
    }, { root: older.parentElement, rootMargin: "0px 0px 400px 0px" });
    this.nearEnd.observe(older);
    archivedToggle?.addEventListener("click", () => this.showView(this.view === "archived" ? "active" : "archived"));
    this.currentId = null;
    this.pendingDelete = null;
    closeOnDismiss(confirm);
    $("#confirm-delete", confirm).addEventListener("click", () => this.deleteConfirmed());
  }

  /** The conversations view's loaded items (the archived ones are apart). */
  get items() {
    return this.views.active.items;
  }

  set items(items) {
    this.views.active.items = items;
  }

  get hasOlder() {
    return this.views[this.view].hasOlder;
  }

  find(id) {
    return this.items.find((c) => c.id === id) || this.views.archived.items.find((c) => c.id === id);
  }

  /** The newest page of the user's conversations; the rest come as the list is scrolled. */
  async load() {
    this.items = (await api.get("/api/conversations")) || [];
    this.views.active.hasOlder = this.items.length >= PAGE;
  }

  /** Show the conversations or the archived ones (loaded afresh each time they are shown). */
  async showView(view) {
    this.view = view;
    this.archivedToggle?.setAttribute("aria-pressed", String(view === "archived"));
    this.list.parentElement.setAttribute("aria-label", view === "archived" ? "Archived conversations" : "Your conversations");
    this.render();
    if (view !== "archived") return;
    try {
      const items = (await api.get(`/api/conversations?archived=true&limit=${PAGE}`)) || [];
      Object.assign(this.views.archived, { items, hasOlder: items.length >= PAGE, loaded: true });
    } catch (err) {
      this.announce(`Could not load archived conversations: ${err.detail || err.message}`);
      return;
    }
    if (this.view !== "archived") return;
    this.render();
    this.announce(`${this.views.archived.items.length} archived conversation${this.views.archived.items.length === 1 ? "" : "s"} shown.`);
  }

  /** The next page of the view shown: the conversations after the last one listed. */
  async loadOlder() {
    const shown = this.views[this.view];
    if (!shown.hasOlder || this.loadingOlder) return;
    const last = shown.items.at(-1);
    this.loadingOlder = true;
    try {
      const archived = this.view === "archived" ? "&archived=true" : "";
      const page = (await api.get(`/api/conversations?${pageAfter(last)}&limit=${PAGE}${archived}`)) || [];
      shown.items.push(...page.filter((c) => !shown.items.some((had) => had.id === c.id)));
      shown.hasOlder = page.length >= PAGE;
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
    this.place(c);
  }

  forget(id) {
    for (const view of Object.values(this.views)) view.items = view.items.filter((c) => c.id !== id);
  }

  /** Put `c` where it belongs now: in the archived view or the other, at its place in the order;
   * left out when that place is past the pages loaded (it comes with a later page). */
  place(c) {
    this.forget(c.id);
    const view = this.views[c.archived_at ? "archived" : "active"];
    if (c.archived_at && !view.loaded) return;
    const at = view.items.findIndex((other) => listOrder(c, other) < 0);
    if (at >= 0) view.items.splice(at, 0, c);
    else if (!view.hasOlder) view.items.push(c);
  }

  /** A reply started in this conversation: move it to the top, and pick up the server's title. */
  touch(id, content) {
    const c = this.find(id);
    if (!c) return;
    const wasArchived = !!c.archived_at;
    c.updated_at = new Date().toISOString();
    c.archived_at = null; // a new turn brings an archived conversation back (reply_rows.py)
    this.place(c);
    this.render();
    if (wasArchived) this.onFiled?.(c);
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
          conversationMenu(c, title, {
            onPin: () => this.file(c, { pinned: !c.pinned_at }),
            onArchive: () => this.file(c, { archived: !c.archived_at }),
          }),
        ),
      );
      if (c.pinned_at) item.classList.add("is-pinned");
      if (this.isLive(c.id)) item.classList.add("is-streaming");
      return item;
    };
    const shown = this.views[this.view].items;
    const group = (label, rows) => [
      h("li", { class: "conv-group", "data-testid": "conversation-group" }, label),
      ...rows.map(row),
    ];
    const pinned = this.view === "active" ? shown.filter((c) => c.pinned_at) : [];
    const rest = pinned.length ? shown.filter((c) => !c.pinned_at) : shown;
    // Pinned ones first; the rest grouped by last activity, in the browser's time zone (date-groups.js).
    const items = [
      ...(pinned.length ? group("Pinned", pinned) : []),
      ...groupByDate(rest).flatMap(([label, rows]) => group(label, rows)),
    ];
    // Keyboard users keep their place: the control that had focus is focused again in the new
    // list, in the item's menu if it was open (a page loaded meanwhile redraws the list).
    const had = this.list.contains(document.activeElement) && document.activeElement;
    const again = had && [had.closest("[data-conversation-id]")?.dataset.conversationId, had.dataset.testid];
    const menuOpen = this.list.querySelector(".conv-more[aria-expanded=true]")?.closest("[data-conversation-id]");
    this.list.replaceChildren(...items);
    this.empty.textContent = EMPTY[this.view];
    this.empty.hidden = shown.length > 0;
    this.older.hidden = !this.hasOlder;
    if (menuOpen) this.itemOf(menuOpen.dataset.conversationId)?.querySelector(".conv-more")?.click();
    if (again) this.focusOn(again[0], again[1]);
  }

  itemOf(id) {
    return this.list.querySelector(`[data-conversation-id="${CSS.escape(id || "")}"]`);
  }

  /** Focus a control of a listed conversation (else its menu's button: the menu is closed). */
  focusOn(id, testid) {
    const item = this.itemOf(id);
    const control = item?.querySelector(`[data-testid="${testid}"]`);
    (control || item?.querySelector("[data-testid=conversation-menu]"))?.focus();
  }

  /** Pin or unpin, archive or unarchive `c` (`changes`: {pinned} or {archived}). */
  async file(c, changes) {
    let updated;
    try {
      updated = await api.patch(`/api/conversations/${enc(c.id)}`, changes);
    } catch (err) {
      this.announce(`Could not change it: ${err.detail || err.message}`);
      return;
    }
    const next = this.views[this.view].items.find((other) => listOrder(other, c) > 0 && other.id !== c.id);
    this.filed(updated);
    const what = "pinned" in changes ? (changes.pinned ? "pinned" : "unpinned") : changes.archived ? "archived" : "unarchived";
    this.announce(`Conversation ${what}.`);
    // The focus stays on its menu where it is still listed, else moves to the next one's.
    if (this.views[this.view].items.some((other) => other.id === c.id)) this.focusOn(c.id, "conversation-menu");
    else if (next) this.focusOn(next.id, "conversation-menu");
    else this.archivedToggle?.focus();
  }

  /** `c` as the server says it is now (an answer or a push event): moved where it belongs. */
  filed(fresh) {
    const c = Object.assign(this.find(fresh.id) || { id: fresh.id, created_at: fresh.updated_at }, {
      title: fresh.title, updated_at: fresh.updated_at, pinned_at: fresh.pinned_at, archived_at: fresh.archived_at,
    });
    this.place(c);
    this.render();
    this.onFiled?.(c);
  }

  /** The dot on each conversation whose reply is streaming. */
  markStreaming() {
    for (const item of this.list.children) {
      if (!item.dataset.conversationId) continue; // a group's heading
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
