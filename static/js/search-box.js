/**
 * The search box over the user's conversations (titles and message text): results as you type,
 * each with the text around the match. While there is a query the results stand in for the
 * conversation list; archived conversations are found too, marked "Archived". The snippet comes from the server in three parts and is built as text nodes,
 * the match wrapped in <mark> by the DOM builder: no HTML string ever reaches the page.
 */

import { api, enc } from "./api.js";
import { h } from "./dom.js";

const DEBOUNCE_MS = 150;

/** A search result's line: the text before the match, the match marked, the text after it. */
export function snippetNode(snippet) {
  return h("span", { class: "search-snippet", "data-testid": "search-snippet" },
    snippet.before, snippet.match ? h("mark", {}, snippet.match) : null, snippet.after);
}

export class SearchBox {
  /**
   * @param input     the <input type=search>
   * @param area      what holds the results (shown while there is a query)
   * @param results   the <ul> the results go into
   * @param empty     the "No matches" line
   * @param list      what the results stand in for (the conversation list's <nav>)
   * @param announce  reads a short status out to screen readers
   * @param onOpen    (conversationId): the user picked a result
   */
  constructor({ input, area, results, empty, list, announce, onOpen }) {
    Object.assign(this, { input, area, results, empty, list, announce, onOpen });
    this.timer = 0;
    this.inflight = null;
    input.addEventListener("input", () => this.schedule());
    input.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && input.value) {
        e.preventDefault(); // the page's Esc (stop a reply, close the drawer) waits for the next one
        this.clear();
      }
    });
  }

  get query() {
    return this.input.value.trim();
  }

  schedule() {
    clearTimeout(this.timer);
    if (!this.query) {
      this.show(null);
      return;
    }
    this.timer = setTimeout(() => this.run(this.query), DEBOUNCE_MS);
  }

  async run(query) {
    this.inflight?.abort(); // only the latest query's answer is shown
    const controller = new AbortController();
    this.inflight = controller;
    let hits;
    try {
      hits = await api.get(`/api/conversations/search?q=${enc(query)}`, { signal: controller.signal });
    } catch (err) {
      if (err.name === "AbortError") return;
      this.results.replaceChildren();
      this.area.hidden = false;
      this.list.hidden = true;
      this.empty.textContent = `Search failed: ${err.detail || err.message}`;
      this.empty.hidden = false;
      return;
    }
    if (controller !== this.inflight || query !== this.query) return;
    this.show(hits || []);
    this.announce(hits.length ? `${hits.length} conversation${hits.length === 1 ? "" : "s"} found.` : "No matches.");
  }

  /** The results (an array), or back to the conversation list (null). */
  show(hits) {
    const searching = hits !== null;
    this.list.hidden = searching;
    this.area.hidden = !searching;
    this.empty.textContent = "No matches.";
    this.empty.hidden = !searching || hits.length > 0;
    this.results.replaceChildren(...(hits || []).map((hit) => this.item(hit)));
  }

  item(hit) {
    return h("li", { class: "search-result", "data-testid": "search-result", "data-conversation-id": hit.conversation_id },
      h("a", {
        class: "conv-link", href: `#${hit.conversation_id}`,
        onclick: (e) => {
          e.preventDefault();
          this.onOpen(hit.conversation_id);
        },
      },
      h("span", { class: "conv-title-text" },
        hit.archived ? h("span", { class: "archived-badge", "data-testid": "archived-badge" }, "Archived") : null,
        hit.title),
      snippetNode(hit.snippet)),
    );
  }

  clear() {
    clearTimeout(this.timer);
    this.inflight?.abort();
    this.input.value = "";
    this.show(null);
  }
}
