/**
 * What the page does with the user's events from their other tabs and devices (push.js): a reply
 * started elsewhere gets its dot in the list and, in the conversation on screen, is resumed like
 * any reply (so it streams here and Stop works here too); created, renamed, pinned, archived and
 * deleted conversations show at once; another version shown elsewhere is shown here too, so that
 * this page sends after what the other showed. Events about what this page did itself change
 * nothing twice.
 */

import { api } from "./api.js";
import { Push } from "./push.js";

export class TabSync {
  /**
   * @param conversations  the ConversationList
   * @param replies        the page's Replies (what streams here)
   * @param reload         (id): reload the conversation on screen (resumes a reply it streams)
   * @param onGone         (conversation): it was deleted (the list's onDeleted)
   * @param shownLeaf      (): the id of the last message on screen (MessageList.lastShownId)
   * @param onSignedOut    (reason): the account was signed out everywhere (disabled, deleted...)
   */
  constructor({ conversations, replies, reload, onGone, shownLeaf = () => null, onSignedOut }) {
    Object.assign(this, { conversations, replies, reload, onGone, shownLeaf, onSignedOut });
    this.elsewhere = new Map(); // conversationId -> messageId of a reply streaming in another tab
  }

  /** A reply streams in this conversation, here or in another tab. */
  isLive(id) {
    return this.elsewhere.has(id);
  }

  handle(ev) {
    const list = this.conversations;
    const id = ev.conversation_id != null ? String(ev.conversation_id) : null;
    switch (ev.event) {
      case "reply_started": {
        this.elsewhere.set(id, String(ev.message_id));
        // A chat its first message named was announced just before (conversation_renamed).
        if (!list.find(id)) this.refetch();
        else list.touch(id, null);
        list.markStreaming();
        if (id === list.currentId && !this.replies.liveFor(id)) this.reload(id);
        return;
      }
      case "reply_ended":
        if (this.elsewhere.get(id) === String(ev.message_id)) this.elsewhere.delete(id);
        list.markStreaming();
        return;
      case "conversation_created":
        if (!list.find(id)) {
          const now = new Date().toISOString();
          list.add({ id, title: ev.title, created_at: now, updated_at: now });
          list.render();
        }
        return;
      case "conversation_renamed": {
        const c = list.find(id);
        if (!c) return void this.refetch();
        if (c.title === ev.title) return;
        c.title = ev.title;
        list.render();
        list.onTitle(c);
        return;
      }
      case "conversation_filed": // pinned, unpinned, archived or unarchived
        list.filed({ id, title: ev.title, updated_at: ev.updated_at, pinned_at: ev.pinned_at, archived_at: ev.archived_at });
        return;
      case "conversation_deleted": {
        this.elsewhere.delete(id);
        const c = list.find(id);
        if (!c) return;
        list.forget(id);
        list.render();
        this.onGone(c);
        return;
      }
      case "branch_shown": {
        // Another page showed another version: this one re-renders (unless it shows that branch
        // already: it switched itself), so what it shows, and sends after, is that branch.
        const leaf = ev.leaf_id != null ? String(ev.leaf_id) : null;
        if (id === list.currentId && !this.replies.liveFor(id) && this.shownLeaf() !== leaf) this.reload(id);
        return;
      }
      case "resync":
        this.resync();
        return;
      case "signed_out":
        this.onSignedOut?.(ev.reason);
        return;
      default:
        return; // an event this page does not know yet
    }
  }

  /** The channel came back after a gap (or the page fell behind): refetch what is shown. */
  resync() {
    this.refetch();
    const id = this.conversations.currentId;
    if (id && !this.replies.liveFor(id)) this.reload(id);
  }

  /** The list again from the server (titles, order, deletions), keeping the page's selection. */
  async refetch() {
    let items;
    try {
      items = (await api.get("/api/conversations")) || [];
    } catch {
      return; // the next event or reconnect tries again
    }
    const list = this.conversations;
    const gone = list.items.filter((c) => !items.some((n) => n.id === c.id));
    list.items = items;
    list.render();
    for (const c of items) if (c.id === list.currentId) list.onTitle(c);
    for (const c of gone) {
      this.elsewhere.delete(c.id);
      this.onGone(c);
    }
  }
}

/** This page's push channel (push.js) feeding a TabSync: the user's other tabs, heard here.
 * `root` gets `data-push="connected"` once the channel is up (the tests wait for it). */
export function hearOtherTabs({ ws, root, ...handlers }) {
  const sync = new TabSync(handlers);
  const push = new Push({
    ws,
    onEvent: (ev) => sync.handle(ev),
    onConnected(again) {
      if (root) root.dataset.push = "connected";
      if (again) sync.resync();
    },
  });
  return { sync, push };
}
