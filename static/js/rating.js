/**
 * Rating a reply: thumbs up or down and an optional comment, one per reply. A thumb saves at
 * once; pressing the pressed one takes the rating back; the comment is saved with its own button.
 * One control per reply view, made on first use (`ratingFor`) and kept across the view's redraws.
 */

import { api, enc } from "./api.js";
import { h } from "./dom.js";

const LABELS = { up: ["👍", "Good reply"], down: ["👎", "Bad reply"] };

let announce = () => {};
/** Where the controls say what they did (the page's screen-reader announcer). */
export function announceRatingsWith(fn) {
  announce = fn;
}

export class RatingControl {
  constructor(messageId) {
    this.messageId = messageId;
    this.rating = null; // "up" | "down" | null
    this.comment = "";
    this.buttons = Object.fromEntries(
      Object.entries(LABELS).map(([value, [glyph, label]]) => [
        value,
        h("button", {
          type: "button", class: "btn btn-small rating-thumb", "data-testid": `rate-${value}`,
          "aria-pressed": "false", "aria-label": label, title: label,
          onclick: () => this.choose(value),
        }, glyph),
      ]),
    );
    this.input = h("input", {
      class: "rating-input", "data-testid": "rating-comment", maxlength: "2000",
      "aria-label": "Comment on this reply (optional)", placeholder: "Add a comment (optional)",
    });
    this.form = h("form", { class: "rating-form", "data-testid": "rating-form", hidden: true,
      onsubmit: (e) => {
        e.preventDefault();
        this.save(this.rating, this.input.value);
      } },
    this.input,
    h("button", { type: "submit", class: "btn btn-small", "data-testid": "rating-save" }, "Save"));
    this.note = h("span", { class: "rating-note muted", "data-testid": "rating-note" });
    this.el = h("span", { class: "rating", role: "group", "aria-label": "Rate this reply", "data-testid": "rating" },
      this.buttons.up, this.buttons.down, this.note, this.form);
  }

  /** Show a stored rating ({rating, comment}) or none (null). */
  set(stored) {
    this.rating = stored?.rating ?? null;
    this.comment = stored?.comment ?? "";
    for (const [value, button] of Object.entries(this.buttons)) {
      button.setAttribute("aria-pressed", String(value === this.rating));
    }
    this.el.dataset.rating = this.rating || "";
    this.note.textContent = this.comment ? `“${this.comment}”` : "";
  }

  async choose(value) {
    if (value === this.rating) return this.remove();
    await this.save(value, this.comment);
    this.input.value = this.comment;
    this.form.hidden = false;
  }

  async save(rating, comment) {
    try {
      const stored = await api.put(`/api/messages/${enc(this.messageId)}/rating`, { rating, comment: comment || null });
      this.set(stored);
      if (comment) this.form.hidden = true;
      announce(comment ? "Rating and comment saved." : "Rating saved.");
    } catch (err) {
      announce(`Could not save the rating: ${err.detail || err.message}`);
    }
  }

  async remove() {
    try {
      await api.del(`/api/messages/${enc(this.messageId)}/rating`);
    } catch (err) {
      if (err.status !== 404) {
        announce(`Could not remove the rating: ${err.detail || err.message}`);
        return;
      }
    }
    this.set(null);
    this.form.hidden = true;
    announce("Rating removed.");
  }
}

/** The rating control of a reply view (made once, kept on the view). */
export function ratingFor(view) {
  if (!view.rating || view.rating.messageId !== view.reply.messageId) {
    view.rating = new RatingControl(view.reply.messageId);
  }
  return view.rating;
}

/** Show the user's stored ratings on the replies under `root` (after a conversation loads). */
export async function loadRatings(conversationId, root) {
  const stored = await api.get(`/api/conversations/${enc(conversationId)}/ratings`);
  for (const r of stored || []) {
    const el = root.querySelector(`[data-message-id="${CSS.escape(r.message_id)}"]`);
    if (el?._view) ratingFor(el._view).set(r);
  }
}
