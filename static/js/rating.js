/**
 * Rating a reply: thumbs up or down and an optional comment, one per reply. A thumb saves at
 * once; pressing the pressed one takes the rating back; the comment is saved with its own button.
 * One control per reply view, made on first use (`ratingFor`) and kept across the view's redraws.
 */

import { api, enc } from "./api.js";
import { h } from "./dom.js";

// Thumbs drawn as stroke icons (Feather's thumbs-up/down paths, MIT): emoji need a font the
// machine may not have.
const LABELS = {
  up: ["M14 9V5a3 3 0 0 0-3-3l-4 9v11h11.28a2 2 0 0 0 2-1.7l1.38-9a2 2 0 0 0-2-2.3zM7 22H4a2 2 0 0 1-2-2v-7a2 2 0 0 1 2-2h3", "Good reply"],
  down: ["M10 15v4a3 3 0 0 0 3 3l4-9V2H5.72a2 2 0 0 0-2 1.7l-1.38 9a2 2 0 0 0 2 2.3zm7-13h2.67A2.31 2.31 0 0 1 22 4v7a2.31 2.31 0 0 1-2.33 2H17", "Bad reply"],
};
const SVG_NS = "http://www.w3.org/2000/svg";

function thumb(pathData) {
  const svg = document.createElementNS(SVG_NS, "svg");
  for (const [k, v] of Object.entries({ viewBox: "0 0 24 24", width: "16", height: "16", "aria-hidden": "true", focusable: "false", class: "icon" })) {
    svg.setAttribute(k, v);
  }
  const path = document.createElementNS(SVG_NS, "path");
  for (const [k, v] of Object.entries({ d: pathData, fill: "none", stroke: "currentColor", "stroke-width": "2", "stroke-linecap": "round", "stroke-linejoin": "round" })) {
    path.setAttribute(k, v);
  }
  svg.append(path);
  return svg;
}

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
      Object.entries(LABELS).map(([value, [pathData, label]]) => [
        value,
        h("button", {
          type: "button", class: "btn btn-small rating-thumb", "data-testid": `rate-${value}`,
          "aria-pressed": "false", "aria-label": label, title: label,
          onclick: () => this.choose(value),
        }, thumb(pathData)),
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
