/**
 * A long conversation is drawn from its newest end: the page shows the newest RENDER_STEP
 * messages (a screenful and more), and draws older ones, RENDER_STEP at a time, as the reader
 * scrolls up to them. Each step is one short task: opening a 2,000-message conversation no longer
 * builds 57,000 nodes in one 1.4 s task that freezes the page.
 *
 * The messages come from two places: rows the page already has but has not drawn (the backlog:
 * the rest of the first page, or a whole branch after a version switch), then the pages before
 * them, fetched from the server (`GET /api/conversations/{id}?before=<oldest id>`, which says how
 * many are `earlier` still). A "Show earlier messages" button at the top of the list does the same
 * for keyboards and screen readers; for the pointer, it loads itself as it nears the viewport.
 * Drawing above the reader keeps what they are reading in place (the list's distance from its
 * bottom is kept).
 */

import { api, enc } from "./api.js";
import { h } from "./dom.js";

export const RENDER_STEP = 30;
const FETCH_PAGE = 100;
const NEAR_PX = 800; // how close to the top the reader is when older messages are drawn

export class OlderMessages {
  /**
   * @param list     the MessageList (its `el`, the scrolling list, and `empty`, its first child)
   * @param render   (rows): the elements of these rows, oldest first
   * @param onDrawn  (conversationId): older messages were just drawn (their ratings, say)
   * @param onStale  (conversationId): the branch changed under the page (another tab): reload
   */
  constructor({ list, render, onDrawn, onStale }) {
    Object.assign(this, { list, render, onDrawn, onStale });
    this.button = h("button", {
      type: "button", class: "btn btn-small older-messages", "data-testid": "older-messages",
      onclick: () => this.drawMore(),
    });
    this.observer = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.drawMore();
    }, { root: list.el, rootMargin: `${NEAR_PX}px 0px 0px 0px` });
    this.observer.observe(this.button);
    this.reset(null, [], 0);
  }

  /** A conversation was just shown: `backlog` are its rows not drawn (oldest first), `earlier`
   * how many more the server has before them, `firstDrawnId` the oldest message drawn. */
  reset(conversationId, backlog, earlier, firstDrawnId = null) {
    Object.assign(this, { conversationId, backlog: [...backlog], earlier });
    this.oldestId = backlog[0]?.id ?? firstDrawnId;
    this.seq = (this.seq || 0) + 1; // a fetch for what was shown before is dropped
    this.busy = false;
    this.place();
  }

  get remaining() {
    return this.backlog.length + this.earlier;
  }

  /** The button sits right after the list's empty state, above the oldest message drawn. */
  place() {
    this.button.hidden = !this.remaining;
    this.button.textContent = `Show earlier messages (${this.remaining})`;
    if (this.button.previousElementSibling !== this.list.empty) this.list.empty.after(this.button);
  }

  async drawMore() {
    if (this.busy || !this.remaining || !this.conversationId) return;
    this.busy = true;
    const seq = this.seq;
    try {
      if (!this.backlog.length) await this.fetchPage();
      if (seq !== this.seq) return;
      const rows = this.backlog.splice(-RENDER_STEP);
      const nodes = this.render(rows);
      const fromBottom = this.list.el.scrollHeight - this.list.el.scrollTop;
      this.button.after(...nodes);
      this.list.el.scrollTop = this.list.el.scrollHeight - fromBottom; // the reader stays put
      this.place();
      this.onDrawn?.(this.conversationId);
    } catch (err) {
      if (seq === this.seq && err.status === 409) this.onStale?.(this.conversationId);
      return;
    } finally {
      if (seq === this.seq) this.busy = false;
    }
    // Still near the top (a tall screen, short messages): the next step, in a task of its own.
    if (this.list.el.scrollTop < NEAR_PX) setTimeout(() => this.drawMore(), 0);
  }

  async fetchPage() {
    const id = this.conversationId;
    const query = `before=${enc(this.oldestId)}&limit=${FETCH_PAGE}`;
    const page = await api.get(`/api/conversations/${enc(id)}?${query}`);
    if (id !== this.conversationId) return;
    this.backlog = page.messages || [];
    this.earlier = page.earlier || 0;
    if (this.backlog.length) this.oldestId = this.backlog[0].id;
  }
}
