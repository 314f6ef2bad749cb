/**
 * The scrolling list of messages: it follows the newest text while the user is at the bottom,
 * offers "Latest" once they scroll up, shows the empty state when there is nothing, and copies
 * code blocks. The messages themselves are MessageViews (message-view.js); their "message-change"
 * events tell the list when to follow.
 */

import { copyText, h } from "./dom.js";

export class MessageList {
  /**
   * @param el     the list (#messages)
   * @param empty  the empty state, kept as the list's first child
   * @param jump   the "Latest" button
   * @param onJump called after "Latest" scrolled to the bottom
   */
  constructor({ el, empty, jump, onJump }) {
    this.el = el;
    this.empty = empty;
    this.jump = jump;
    this.stick = true; // follow the newest text (until the user scrolls up)

    el.addEventListener("message-change", () => this.follow());
    el.addEventListener("scroll", () => {
      this.stick = this.atBottom();
      if (this.stick) jump.hidden = true;
    });
    el.addEventListener("click", (e) => this.copyCode(e));
    jump.addEventListener("click", () => {
      this.scrollToBottom();
      onJump?.();
    });
  }

  atBottom() {
    const m = this.el;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 48;
  }

  scrollToBottom() {
    this.el.scrollTop = this.el.scrollHeight;
    this.stick = true;
    this.jump.hidden = true;
  }

  /** Content grew: follow it if the user is at the bottom, else offer a way back. */
  follow() {
    if (this.stick) this.el.scrollTop = this.el.scrollHeight;
    else this.jump.hidden = false;
  }

  hasMessages() {
    return !!this.el.querySelector("[data-testid=message]");
  }

  updateEmptyState() {
    this.empty.hidden = this.hasMessages();
  }

  append(view) {
    this.el.append(view.el);
    this.updateEmptyState();
  }

  /** Show exactly these message elements (none: the empty state). */
  show(nodes = []) {
    this.el.replaceChildren(this.empty, ...nodes);
    this.updateEmptyState();
  }

  showLoadError(text) {
    this.el.replaceChildren(h("p", { class: "load-error", role: "alert" }, text));
  }

  isLatest(view) {
    return view.el === this.el.lastElementChild;
  }

  /** The id of the last stored message on screen: the end of the branch shown, which a new
   * question follows (null: none; a message the server never took is not one). */
  lastShownId() {
    for (let node = this.el.lastElementChild; node; node = node.previousElementSibling) {
      const r = node._view?.reply;
      if (r?.messageId && !r.notSent) return String(r.messageId);
    }
    return null;
  }

  /** The user message right before an assistant message, in page order. */
  promptFor(view) {
    let node = view.el.previousElementSibling;
    while (node && !(node._view && node._view.role === "user")) node = node.previousElementSibling;
    return node ? node._view : null;
  }

  async copyCode(e) {
    const button = e.target.closest(".code-copy");
    if (!button) return;
    const code = button.closest("pre")?.querySelector("code");
    const ok = await copyText(code ? code.textContent : "");
    button.dataset.copied = ok ? "yes" : "no";
    setTimeout(() => delete button.dataset.copied, 1500);
  }
}
