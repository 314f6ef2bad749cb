/**
 * One message on screen: the user's words as plain text, or an assistant reply rendered from
 * Markdown as it grows, with its status badge, error line, actions (Retry, Copy, Regenerate,
 * Details) and details (timings, tokens, transport).
 *
 * No page state here: a view says what happened by events that bubble from its element (each
 * with `detail.view`): "message-change" when its content changed size, "message-retry" and
 * "message-regenerate" when the user asks for those. Text only ever becomes text nodes; the
 * Markdown DOM is built by markdown.js from its allowlist.
 */

import { renderBranchControls } from "./branches.js";
import { copyText, flash, h } from "./dom.js";
import { formatDuration } from "./format.js";
import { nodeToDOM, parseMarkdown } from "./markdown.js";
import { MarkdownStream } from "./markdown-stream.js";
import { ratingFor } from "./rating.js";
import { tokensPerSecond } from "./reply.js";

/** How each end state is labelled on its badge, and the badge's tooltip. */
export const BADGES = {
  cancelled: ["stopped", "This reply was stopped."],
  length: ["length limit", "The reply reached the maximum number of tokens."],
  disconnected: ["connection lost", "The connection was lost and the server stopped the reply."],
  failed: ["failed", "The reply failed."],
  interrupted: ["interrupted", "The server stopped while writing this reply."],
  truncated: ["truncated", "The stream ended before the reply was complete."],
  rejected: ["not sent", "The server refused the message."],
};

/** A stopped reply's badge says who stopped it (the server's `stopped_by`). */
export const STOPPED_BY = {
  user: ["stopped", "You stopped this reply."],
  admin: ["stopped by an admin", "An admin stopped this reply."],
  signed_out: ["stopped: signed out", "The reply stopped when your account was signed out."],
};

/** The badge of a reply that has ended ([label, tooltip]), or undefined for none. */
export function endBadge(reply) {
  if (reply.status === "cancelled") return STOPPED_BY[reply.stoppedBy] ?? BADGES.cancelled;
  return BADGES[reply.status];
}

let viewCounter = 0;

/** A block's tree as a string, to tell whether its DOM can stay; once per tree (finished ones are kept). */
const blockKeys = new WeakMap();
function blockKey(block) {
  let key = blockKeys.get(block);
  if (key === undefined) {
    key = JSON.stringify(block);
    blockKeys.set(block, key);
  }
  return key;
}

/** Code blocks get their language label (CSS reads data-lang) and a copy button. */
function decorateCode(node) {
  const pres = node.nodeName === "PRE" ? [node] : node.querySelectorAll ? node.querySelectorAll("pre") : [];
  for (const pre of pres) {
    const code = pre.querySelector("code");
    const lang = code && /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
    if (lang) pre.dataset.lang = lang[1];
    pre.append(h("button", { type: "button", class: "code-copy", "aria-label": "Copy code", title: "Copy code" }));
  }
}

export class MessageView {
  /**
   * @param role   "user" | "assistant"
   * @param reply  a ReplyState (assistant) or {text, status, messageId} (user)
   */
  constructor(role, reply) {
    this.role = role;
    this.reply = reply;
    this.uid = ++viewCounter;
    this.raf = 0;
    this.timer = 0;
    this.nextRenderAt = 0;
    this.reconnecting = null;
    this.stopping = false;
    this.stopError = null; // why the last Stop did not reach the server (the reply goes on)
    this.transport = null;
    this.stream = null;

    this.textEl = h("div", { class: role === "user" ? "msg-text plain" : "msg-text md", "data-testid": "message-text" });
    this.metaEl = h("div", { class: "msg-meta" });
    this.el = h(
      "article",
      { class: `msg msg-${role}`, "data-testid": "message", "data-role": role, "aria-label": role === "user" ? "You said" : "Assistant replied" },
      h("div", { class: "msg-body" }, this.textEl, this.metaEl),
    );
    this.el._view = this;
    if (role === "assistant") {
      this.detailsOpen = false;
      this.detailsId = `details-${this.uid}`;
    }
    this.setMessageId(reply.messageId);
    this.renderNow();
    this.update();
  }

  get text() {
    return this.reply.text;
  }

  get status() {
    return this.reply.status;
  }

  setMessageId(id) {
    if (id) {
      this.reply.messageId = String(id);
      this.el.dataset.messageId = String(id);
    }
  }

  /**
   * Render the text now (markdown for replies, plain text for the user's words).
   * While a reply grows, only its last blocks change: MarkdownStream re-parses only the open end
   * of the text (finished blocks are kept as they are), and top-level blocks whose parse is
   * unchanged keep their DOM nodes, so a long reply neither re-parses nor re-lays out from the top
   * on every token.
   */
  renderNow() {
    cancelAnimationFrame(this.raf);
    clearTimeout(this.timer);
    this.raf = 0;
    this.timer = 0;
    if (this.role === "user") {
      this.textEl.textContent = this.reply.text;
      return;
    }
    const t0 = performance.now();
    this.markdown ??= new MarkdownStream();
    // While it streams, only the open end is parsed again (markdown-stream.js); blocks[0, finished)
    // stay as they are, and a fence is highlighted once its closing line is in (markdown.js). At
    // the end, one full parse with `final`, which also highlights a fence the reply left open.
    const blocks =
      this.reply.status === "streaming"
        ? this.markdown.update(this.reply.text).blocks
        : parseMarkdown(this.reply.text, { final: true }).children;
    const keys = blocks.map(blockKey);
    const old = this.blockKeys || [];
    const nodes = this.blockNodes || [];
    let same = 0;
    while (same < old.length && same < keys.length && old[same] === keys[same] && nodes[same]?.parentNode === this.textEl) same++;
    if (same === 0) this.textEl.replaceChildren();
    for (let k = same; k < nodes.length; k++) nodes[k].remove();
    nodes.length = same;
    for (let k = same; k < blocks.length; k++) {
      const node = nodeToDOM(blocks[k]);
      decorateCode(node);
      this.textEl.append(node);
      nodes.push(node);
    }
    this.blockKeys = keys;
    this.blockNodes = nodes;
    const cost = performance.now() - t0;
    // Long replies cost more to re-render: render less often rather than stall the page.
    this.nextRenderAt = cost > 8 ? performance.now() + cost * 3 : 0;
    this.changed();
  }

  /** Coalesce renders to at most one per frame (fewer for long replies). */
  scheduleRender() {
    if (this.raf || this.timer) return;
    const wait = this.nextRenderAt - performance.now();
    if (wait > 0) {
      this.timer = setTimeout(() => {
        this.timer = 0;
        this.raf = requestAnimationFrame(() => this.renderNow());
      }, wait);
    } else {
      this.raf = requestAnimationFrame(() => this.renderNow());
    }
  }

  setReconnecting(info) {
    this.reconnecting = info;
    this.update();
  }

  /** Re-draw the status attributes, badge, error, actions and details. */
  update() {
    const r = this.reply;
    const streaming = r.status === "streaming";
    this.el.dataset.status = r.status;
    if (this.transport) this.el.dataset.transport = this.transport;
    renderBranchControls(this); // versions switcher, Edit (branches.js)
    if (this.role === "user") return;

    // Not a live region (read token by token, a reply would drown everything else out): the page's
    // status line says when it starts and reads it once it has ended (see spokenText).
    this.el.setAttribute("aria-busy", streaming ? "true" : "false");
    if (streaming && !r.text) this.textEl.classList.add("waiting");
    else this.textEl.classList.remove("waiting");

    const parts = [];
    let badge = null;
    if (streaming && this.stopping) badge = ["stopping…", "Stopping the reply."];
    else if (streaming && this.reconnecting)
      badge = [this.reconnecting.offline ? "offline — waiting" : "reconnecting…", "The connection dropped; resuming where it left off."];
    else if (endBadge(r)) badge = endBadge(r);
    if (badge) {
      parts.push(
        h("span", { class: `badge badge-${streaming ? "pending" : r.status}`, "data-testid": "badge", title: badge[1] }, badge[0]),
      );
    }
    if (streaming && this.stopError) parts.push(this.stopFailure());
    if (!streaming && r.error && (r.status === "failed" || r.status === "truncated" || r.status === "interrupted")) {
      parts.push(h("p", { class: "msg-error", "data-testid": "message-error", role: "alert" }, r.error));
    }
    if (!streaming) parts.push(this.actions());
    if (this.detailsOpen) parts.push(this.details());
    this.metaEl.replaceChildren(...parts);
    this.changed();
  }

  /** Stop did not reach the server: say so, and offer to try again (the reply is still going). */
  stopFailure() {
    return h(
      "div", { class: "msg-error stop-error", "data-testid": "stop-error", role: "alert" },
      `Could not stop the reply (${this.stopError}). It is still being written. `,
      h("button", {
        type: "button", class: "btn btn-small btn-primary", "data-testid": "stop-retry", "aria-label": "Try to stop the reply again",
        onclick: () => this.stream?.stop(),
      }, "Try again"),
    );
  }

  actions() {
    const r = this.reply;
    const bar = h("div", { class: "msg-actions", role: "group", "aria-label": "Reply actions" });
    if (r.status === "failed" || r.status === "truncated") {
      bar.append(
        h("button", {
          type: "button", class: "btn btn-small btn-primary", "data-testid": "retry",
          "aria-label": r.status === "truncated" ? "Retry: resume this reply" : "Retry this reply",
          onclick: () => this.emit("message-retry"),
        }, "Retry"),
      );
    }
    if (r.text) {
      bar.append(
        h("button", {
          type: "button", class: "btn btn-small", "data-testid": "copy", "aria-label": "Copy reply",
          onclick: async (e) => flash(e.currentTarget, (await copyText(r.text)) ? "Copied" : "Copy failed"),
        }, "Copy"),
      );
    }
    if (!r.notSent) {
      bar.append(
        h("button", {
          type: "button", class: "btn btn-small", "data-testid": "regenerate", "aria-label": "Regenerate this reply",
          onclick: () => this.emit("message-regenerate"),
        }, "Regenerate"),
      );
    }
    if (r.messageId && !r.notSent) bar.append(ratingFor(this).el);
    bar.append(
      h("button", {
        type: "button", class: "btn btn-small", "data-testid": "details",
        "aria-expanded": this.detailsOpen ? "true" : "false", "aria-controls": this.detailsId,
        onclick: () => {
          this.detailsOpen = !this.detailsOpen;
          this.update();
          this.metaEl.querySelector("[data-testid=details]")?.focus();
        },
      }, this.detailsOpen ? "Hide details" : "Details"),
    );
    return bar;
  }

  details() {
    const r = this.reply;
    const t = r.timings || {};
    const u = r.usage || {};
    const rows = [];
    const add = (label, value) => {
      if (value != null && value !== "") rows.push(h("dt", {}, label), h("dd", {}, String(value)));
    };
    add("Status", r.finishReason ? `${r.status} (${r.finishReason})` : r.status);
    add("Time to first token", formatDuration(t.ttft_ms));
    add("First token seen by this page", formatDuration(r.clientTtftMs));
    const tps = tokensPerSecond(u, t);
    add("Speed", tps != null ? `${tps.toFixed(1)} tokens/s` : null);
    if (t.gap_p50_ms != null || t.gap_p99_ms != null) {
      add("Gap between tokens", `p50 ${formatDuration(t.gap_p50_ms) ?? "–"} · p99 ${formatDuration(t.gap_p99_ms) ?? "–"}`);
    }
    add("Total time", formatDuration(t.total_ms));
    add("Prompt tokens", u.prompt_tokens);
    add("Completion tokens", u.completion_tokens);
    add("Transport", this.transport ? (this.transport === "ws" ? "WebSocket" : "SSE") : null);
    if (this.stream?.reconnects) add("Reconnects", this.stream.reconnects);
    if (!rows.length) rows.push(h("dt", {}, "Details"), h("dd", {}, "not available"));
    return h("dl", { class: "msg-details", id: this.detailsId, "data-testid": "message-details" }, rows);
  }

  /** What a screen reader hears when the reply has ended: its end state, then its text, once. */
  spokenText() {
    const label = endBadge(this.reply)?.[0];
    return [label ? `Reply ${label}.` : "Reply finished.", this.textEl.innerText.trim()].filter(Boolean).join(" ");
  }

  /** Tell the message list what happened here (the list and the page listen; see the header). */
  emit(type) {
    this.el.dispatchEvent(new CustomEvent(type, { bubbles: true, detail: { view: this } }));
  }

  /** The text or the status line changed (so the list can keep the newest text in sight). */
  changed() {
    this.emit("message-change");
  }

  /** The reply ended (or was given up on): final render, then the end state. */
  finish() {
    this.reconnecting = null;
    this.stopping = false;
    this.stopError = null;
    this.renderNow();
    this.update();
  }
}
