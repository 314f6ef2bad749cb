/**
 * What the model sees, on the page (issue 22): the divider above the first message still inside
 * the model's window for the latest reply of the branch shown, the context meter by the composer
 * (tokens the latest reply used, of the model's context: the server's own count), and the
 * composer's check of a draft against the longest message that fits. The decisions are pure
 * (context-window.js); this draws them, inertly (text nodes only).
 *
 * Its facts come from the conversation as read (`GET /api/conversations/{id}` and the branch
 * switch: each reply's `window_start_id`, `prompt_tokens`, `completion_tokens`; `context`), from
 * a reply's `final` frame (`context_tokens`, `context_size`), and, once a reply has started, from
 * its row (`?limit=2`: where its window begins is stored as it starts).
 */

import { api, enc } from "./api.js";
import { $, h } from "./dom.js";
import { dividerBefore, latestReply, messageFits, meterReading, storedUse } from "./context-window.js";

const DIVIDER = "Earlier messages are outside the model's memory";
const numbers = new Intl.NumberFormat("en-US");

export class ContextView {
  /**
   * @param list       the MessageList (its `el`)
   * @param older      the OlderMessages (`remaining`: messages of the branch not drawn yet)
   * @param meter      the meter's box (#context-meter): its bar and its text inside
   * @param composer   the Composer (its `input`, `send`; `setTooLong` holds Send while over)
   * @param note       the line that says why Send waits (#composer-limit)
   * @param currentId  () => the conversation on screen
   * @param announce   reads a short status out to screen readers
   */
  constructor({ list, older, composer, currentId, announce, meter = $("#context-meter"), note = $("#composer-limit") }) {
    Object.assign(this, { list, older, meter, composer, note, currentId, announce });
    this.divider = h(
      "div",
      { class: "context-divider", role: "separator", "aria-label": DIVIDER, "data-testid": "context-divider" },
      h("span", { class: "context-divider-text" }, DIVIDER),
    );
    this.bar = meter.querySelector(".context-meter-bar");
    this.fill = meter.querySelector(".context-meter-fill");
    this.text = meter.querySelector(".context-meter-text");
    this.limits = null;
    this.clear();
    composer.input.addEventListener("input", () => this.checkDraft());
    // Messages drawn or redrawn (a load, older ones as the reader scrolls up, a send, an edit):
    // the window's start may have just been drawn, or the divider dropped with the old messages.
    new MutationObserver(() => this.placeDivider()).observe(list.el, { childList: true });
    // The chat's settings (its reply length, its system prompt) change the longest message.
    $("#settings-dialog")?.addEventListener("close", () => this.currentId() && this.refresh(this.currentId()));
  }

  /** No conversation on screen, or a fresh one: no window, nothing used. The limits of the last
   * one stay (the next load replaces them): a first message is checked all the same. */
  clear() {
    Object.assign(this, { startId: null, used: null });
    this.draw();
  }

  /** The conversation as the server read it (a load, a branch switch, a page of it). */
  show(data) {
    const rows = data.messages || [];
    const reply = latestReply(rows);
    this.startId = reply?.window_start_id ?? null;
    this.limits = data.context ?? null;
    this.used = storedUse(rows) ?? (reply ? null : 0);
    this.draw();
  }

  /** The newest of `conversationId` again (a reply just started: where its window begins is
   * stored; a fresh conversation, `clear`: its limits). */
  async refresh(conversationId, { clear = false } = {}) {
    if (clear) this.clear();
    let data;
    try {
      data = await api.get(`/api/conversations/${enc(conversationId)}?limit=2`);
    } catch {
      return; // the next load says it
    }
    if (conversationId !== this.currentId()) return;
    const rows = data.messages || [];
    const reply = latestReply(rows);
    if (reply) this.startId = reply.window_start_id ?? null;
    this.limits = data.context ?? this.limits;
    this.used = reply ? (storedUse(rows) ?? this.used) : 0; // a reply still running: as it was
    this.draw();
  }

  /** A reply ended: the context it used, by the server's count (its final frame; one replayed
   * from the database may not say: then its stored counts). */
  replyEnded(conversationId, state) {
    if (conversationId !== this.currentId()) return;
    if (!state.contextTokens) return void this.refresh(conversationId);
    this.used = state.contextTokens;
    if (state.contextSize) this.limits = { ...this.limits, context_size: state.contextSize };
    this.draw();
  }

  draw() {
    this.placeDivider();
    this.drawMeter();
    this.checkDraft();
  }

  /** The divider above the window's first message, when that message is drawn. */
  placeDivider() {
    const drawn = [...this.list.el.querySelectorAll(":scope > [data-testid=message]")];
    const ids = drawn.map((el) => el.dataset.messageId || "");
    const id = dividerBefore(this.startId, ids, this.older.remaining);
    const target = id && drawn[ids.indexOf(id)];
    if (!target) this.divider.remove();
    else if (target.previousElementSibling !== this.divider) target.before(this.divider);
  }

  drawMeter() {
    const reading = this.used == null ? null : meterReading(this.used, this.limits?.context_size);
    this.meter.hidden = !reading;
    if (!reading) return;
    this.bar.setAttribute("aria-valuemax", String(reading.max));
    this.bar.setAttribute("aria-valuenow", String(reading.value));
    this.bar.setAttribute("aria-valuetext", reading.spoken);
    this.fill.style.width = `${reading.percent}%`;
    this.text.textContent = reading.text;
    this.meter.dataset.used = String(this.used);
    this.meter.dataset.size = String(reading.max);
  }

  /** Send waits, saying why, while the draft is surely too long (a lower-bound estimate; the
   * server stays the judge: its refusal shows in the composer's error line). */
  checkDraft() {
    const draft = this.composer.input.value;
    const fits = messageFits(draft, this.limits?.max_message_tokens);
    const over = fits.over && !!draft.trim();
    if (over) {
      this.note.textContent =
        `This message is too long for the model: at least ${numbers.format(fits.tokens)} tokens, ` +
        `and the longest that fits is ${numbers.format(fits.limit)}. Shorten it to send.`;
    }
    if (over !== !this.note.hidden) {
      this.note.hidden = !over;
      if (over) this.announce("This message is too long for the model. Shorten it to send.");
    }
    this.composer.setTooLong(over);
  }
}
