/**
 * The chat page: conversations in a sidebar, the message list, a composer whose Send turns into
 * Stop while a reply streams, a transport toggle (SSE / WebSocket), and the account dialog.
 *
 * Streaming logic lives in stream.js (transport-agnostic) and the transports; this module is the
 * DOM. Model and user text only ever reach the page as text nodes (markdown.js builds elements
 * from an allowlist; nothing here uses innerHTML).
 */

import { api, ApiError, enc, setUnauthorizedHandler } from "./api.js";
import { $, copyText, flash, h, icon } from "./dom.js";
import { nodeToDOM, parseMarkdown } from "./markdown.js";
import { FINAL_STATUSES, ReplyState, tokensPerSecond } from "./reply.js";
import { conversationIdFromHash } from "./route.js";
import { ReplyStream } from "./stream.js";
import { SseTransport } from "./transport-sse.js";
import { WsTransport } from "./transport-ws.js";

const TRANSPORT_KEY = "streamchat.transport";
const DEFAULT_TITLE = "New chat";

const BADGES = {
  cancelled: ["stopped", "You stopped this reply."],
  length: ["length limit", "The reply reached the maximum number of tokens."],
  disconnected: ["connection lost", "The connection was lost and the server stopped the reply."],
  failed: ["failed", "The reply failed."],
  interrupted: ["interrupted", "The server stopped while writing this reply."],
  truncated: ["truncated", "The stream ended before the reply was complete."],
  rejected: ["not sent", "The server refused the message."],
};

// ---------------------------------------------------------------------------------------------
// Page state

const root = $("#app");
const els = {
  list: $("#conversation-list"),
  listEmpty: $("#conversations-empty"),
  messages: $("#messages"),
  empty: $("#empty-state"),
  title: $("#conv-title"),
  form: $("#composer-form"),
  input: $("#composer"),
  send: $("#send"),
  composerError: $("#composer-error"),
  transport: $("#transport"),
  jump: $("#jump-latest"),
  net: $("#net-status"),
  sr: $("#sr-status"),
  sidebarToggle: $("#sidebar-toggle"),
  backdrop: $("#backdrop"),
};

const state = {
  conversations: [], // [{id, title, created_at, updated_at}], newest first
  currentId: null,
  loadSeq: 0,
  live: new Map(), // conversationId -> {stream, view, userView}
  stick: true, // follow the newest text (until the user scrolls up)
};

function goToLogin() {
  const next = encodeURIComponent(location.pathname + location.hash);
  location.assign(`/login?next=${next}`);
}
setUnauthorizedHandler(goToLogin);

const transports = {
  sse: new SseTransport(),
  ws: new WsTransport({ onUnauthorized: goToLogin }),
};

function transportName() {
  return els.transport.value === "ws" ? "ws" : "sse";
}

// ---------------------------------------------------------------------------------------------
// Small helpers

let announceTimer = 0;
function announce(text) {
  clearTimeout(announceTimer);
  els.sr.textContent = "";
  announceTimer = setTimeout(() => {
    els.sr.textContent = text;
  }, 50);
}

function showComposerError(text) {
  els.composerError.textContent = text || "";
  els.composerError.hidden = !text;
}

function fmtMs(v) {
  if (v == null || !Number.isFinite(Number(v))) return null;
  const n = Number(v);
  return n >= 10000 ? `${(n / 1000).toFixed(1)} s` : `${Math.round(n)} ms`;
}

function atBottom() {
  const m = els.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 48;
}

function scrollToBottom() {
  els.messages.scrollTop = els.messages.scrollHeight;
  state.stick = true;
  els.jump.hidden = true;
}

/** Content grew: follow it if the user is at the bottom, else offer a way back. */
function contentChanged(view) {
  if (!view.el.isConnected) return;
  if (state.stick) els.messages.scrollTop = els.messages.scrollHeight;
  else els.jump.hidden = false;
}

function updateEmptyState() {
  els.empty.hidden = !!els.messages.querySelector("[data-testid=message]");
}

// ---------------------------------------------------------------------------------------------
// A message on screen

let viewCounter = 0;

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

class MessageView {
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
   * While a reply grows, only its last blocks change: top-level blocks whose parse is unchanged
   * keep their DOM nodes, so a long reply does not re-layout from the top on every token.
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
    const blocks = parseMarkdown(this.reply.text).children;
    const keys = blocks.map((b) => JSON.stringify(b));
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
    contentChanged(this);
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
    if (this.role === "user") return;

    this.textEl.setAttribute("aria-live", "polite");
    this.textEl.setAttribute("aria-busy", streaming ? "true" : "false");
    if (streaming && !r.text) this.textEl.classList.add("waiting");
    else this.textEl.classList.remove("waiting");

    const parts = [];
    let badge = null;
    if (streaming && this.stopping) badge = ["stopping…", "Stopping the reply."];
    else if (streaming && this.reconnecting)
      badge = [this.reconnecting.offline ? "offline — waiting" : "reconnecting…", "The connection dropped; resuming where it left off."];
    else if (BADGES[r.status]) badge = BADGES[r.status];
    if (badge) {
      parts.push(
        h("span", { class: `badge badge-${streaming ? "pending" : r.status}`, "data-testid": "badge", title: badge[1] }, badge[0]),
      );
    }
    if (!streaming && r.error && (r.status === "failed" || r.status === "truncated" || r.status === "interrupted")) {
      parts.push(h("p", { class: "msg-error", "data-testid": "message-error", role: "alert" }, r.error));
    }
    if (!streaming) parts.push(this.actions());
    if (this.detailsOpen) parts.push(this.details());
    this.metaEl.replaceChildren(...parts);
    contentChanged(this);
  }

  actions() {
    const r = this.reply;
    const bar = h("div", { class: "msg-actions", role: "group", "aria-label": "Reply actions" });
    if (r.status === "failed" || r.status === "truncated") {
      bar.append(
        h("button", {
          type: "button", class: "btn btn-small btn-primary", "data-testid": "retry",
          "aria-label": r.status === "truncated" ? "Retry: resume this reply" : "Retry this reply",
          onclick: () => retry(this),
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
          onclick: () => regenerate(this),
        }, "Regenerate"),
      );
    }
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
    add("Time to first token", fmtMs(t.ttft_ms));
    add("First token seen by this page", fmtMs(r.clientTtftMs));
    const tps = tokensPerSecond(u, t);
    add("Speed", tps != null ? `${tps.toFixed(1)} tokens/s` : null);
    if (t.gap_p50_ms != null || t.gap_p99_ms != null) {
      add("Gap between tokens", `p50 ${fmtMs(t.gap_p50_ms) ?? "–"} · p99 ${fmtMs(t.gap_p99_ms) ?? "–"}`);
    }
    add("Total time", fmtMs(t.total_ms));
    add("Prompt tokens", u.prompt_tokens);
    add("Completion tokens", u.completion_tokens);
    add("Transport", this.transport ? (this.transport === "ws" ? "WebSocket" : "SSE") : null);
    if (this.stream?.reconnects) add("Reconnects", this.stream.reconnects);
    if (!rows.length) rows.push(h("dt", {}, "Details"), h("dd", {}, "not available"));
    return h("dl", { class: "msg-details", id: this.detailsId, "data-testid": "message-details" }, rows);
  }

  /** The reply ended (or was given up on): final render, then the end state. */
  finish() {
    this.reconnecting = null;
    this.stopping = false;
    this.renderNow();
    this.update();
  }
}

// ---------------------------------------------------------------------------------------------
// Streaming a reply

function liveFor(conversationId) {
  return state.live.get(conversationId) || null;
}

function updateComposer() {
  const live = liveFor(state.currentId);
  const streaming = !!live;
  els.send.dataset.state = streaming ? "streaming" : "idle";
  els.send.textContent = streaming ? "Stop" : "Send";
  els.send.setAttribute("aria-label", streaming ? "Stop the reply" : "Send");
  els.send.classList.toggle("btn-stop", streaming);
  for (const item of els.list.children) {
    item.classList.toggle("is-streaming", state.live.has(item.dataset.conversationId));
  }
}

/**
 * Run a reply's stream and keep its view up to date.
 * @param request  {kind: "send", conversationId, content}, {kind: "regenerate", messageId} or
 *                 {kind: "resume"}
 * @param replaces the reply a regenerate replaces: back in its place if the server refuses
 * @param t0       performance.now() when the user pressed Send (for the page's TTFT), or null
 */
function runReply({ conversationId, view, userView = null, replaces = null, request, t0 = null }) {
  const transport = transports[transportName()];
  const reply = view.reply;
  reply.status = "streaming";
  reply.error = null;
  view.transport = transport.name;
  view.update();
  let ttft = null;
  const stream = new ReplyStream({
    transport,
    request,
    state: reply,
    hooks: {
      onStart(s) {
        view.setMessageId(s.messageId);
        if (userView) {
          userView.setMessageId(s.userMessageId);
          userView.reply.status = "completed";
          userView.update();
        }
        view.setReconnecting(null);
        touchConversation(conversationId, request.kind === "send" ? request.content : null);
      },
      onFirstDelta() {
        if (t0 != null) {
          ttft = performance.now() - t0;
          reply.clientTtftMs = Math.round(ttft);
        }
      },
      onText() {
        if (view.reconnecting) view.setReconnecting(null);
        view.scheduleRender();
      },
      onReconnecting(_s, info) {
        view.setReconnecting(info);
        announce(info.offline ? "You are offline. The reply will resume when you are back." : "Connection lost. Reconnecting…");
      },
      onStopping() {
        view.stopping = true;
        view.update();
      },
      onRejected(s, err) {
        if (replaces) view.el.replaceWith(replaces.el);
        else view.el.remove();
        userView?.el.remove();
        updateEmptyState();
        if (request.kind === "send" && !els.input.value) els.input.value = request.content;
        showComposerError(s.error || err.message);
        announce(`Not sent: ${s.error || err.message}`);
      },
      onFinal(s) {
        view.finish();
        if (userView && userView.reply.status === "sending") {
          userView.reply.status = s.notSent ? "failed" : "completed";
          userView.update();
        }
        if (ttft != null && s.messageId && FINAL_STATUSES.has(s.status)) {
          // Fire and forget: the page's TTFT, next to the engine's, shows a buffering proxy.
          api.post(`/api/messages/${enc(s.messageId)}/client-metrics`, { ttft_ms: Math.round(ttft) }).catch(() => {});
        }
        const label = BADGES[s.status]?.[0];
        announce(label ? `Reply ${label}.` : "Reply finished.");
      },
    },
  });
  view.stream = stream;
  state.live.set(conversationId, { stream, view, userView });
  updateComposer();
  return stream.run().finally(() => {
    if (state.live.get(conversationId)?.stream === stream) state.live.delete(conversationId);
    updateComposer();
  });
}

function appendView(view) {
  els.messages.append(view.el);
  updateEmptyState();
}

async function send(content, { t0 = performance.now() } = {}) {
  showComposerError("");
  if (!content.trim()) return;
  let conversationId = state.currentId;
  if (conversationId && liveFor(conversationId)) return; // one reply at a time per conversation
  if (!conversationId) {
    try {
      const created = await api.post("/api/conversations", {});
      state.conversations.unshift(created);
      conversationId = created.id;
      await openConversation(conversationId, { fresh: true });
    } catch (err) {
      showComposerError(`Could not start a conversation: ${err.detail || err.message}`);
      return;
    }
  }
  const userView = new MessageView("user", { text: content, status: "sending", messageId: null });
  const view = new MessageView("assistant", new ReplyState({ conversationId }));
  appendView(userView);
  appendView(view);
  scrollToBottom();
  announce("Sent. The assistant is replying.");
  await runReply({ conversationId, view, userView, request: { kind: "send", conversationId, content }, t0 });
}

function stopCurrent() {
  const live = liveFor(state.currentId);
  if (live) {
    live.stream.stop();
    els.input.focus();
  }
}

/** The user message right before an assistant message, in page order. */
function promptFor(view) {
  let node = view.el.previousElementSibling;
  while (node && !(node._view && node._view.role === "user")) node = node.previousElementSibling;
  return node ? node._view : null;
}

/** Answer the latest reply's question again: the new reply takes its place (server and page). */
function regenerate(view) {
  const conversationId = state.currentId;
  if (liveFor(conversationId)) return;
  if (!view.reply.messageId || view.el !== els.messages.lastElementChild) {
    showComposerError("Only the latest reply can be regenerated.");
    return;
  }
  showComposerError("");
  const fresh = new MessageView("assistant", new ReplyState({ conversationId }));
  view.el.replaceWith(fresh.el);
  scrollToBottom();
  announce("Regenerating the reply.");
  return runReply({
    conversationId,
    view: fresh,
    replaces: view,
    request: { kind: "regenerate", messageId: view.reply.messageId },
    t0: performance.now(),
  });
}

function retry(view) {
  const r = view.reply;
  if (liveFor(state.currentId)) return;
  if (r.status === "truncated" && r.messageId) {
    // The server may still have the rest: resume from what we have.
    runReply({ conversationId: state.currentId, view, request: { kind: "resume" } });
    return;
  }
  const prompt = promptFor(view);
  if (r.notSent && prompt) {
    // Nothing reached the server (as far as we know): send the same words again, in place.
    prompt.el.remove();
    view.el.remove();
    send(prompt.text);
    return;
  }
  regenerate(view);
}

// ---------------------------------------------------------------------------------------------
// Conversations

function conversationTitle(c) {
  return (c && c.title) || DEFAULT_TITLE;
}

function setTitle(text) {
  els.title.textContent = text;
  document.title = `${text} · StreamChat`;
}

/** A reply started in this conversation: move it to the top, and pick up the server's title. */
function touchConversation(id, content) {
  const idx = state.conversations.findIndex((c) => c.id === id);
  if (idx === -1) return;
  const [c] = state.conversations.splice(idx, 1);
  c.updated_at = new Date().toISOString();
  if (content && (!c.title || c.title === DEFAULT_TITLE)) c.title = [...content].slice(0, 80).join(""); // code points, as the server cuts it
  state.conversations.unshift(c);
  renderConversationList();
  if (id === state.currentId) setTitle(conversationTitle(c));
}

function renderConversationList() {
  const items = state.conversations.map((c) => {
    const title = conversationTitle(c);
    const current = c.id === state.currentId;
    const link = h(
      "a",
      {
        class: "conv-link", href: `#${c.id}`, "data-testid": "conversation-link",
        "aria-current": current ? "page" : null,
        onclick: (e) => {
          e.preventDefault();
          openConversation(c.id);
          closeSidebar();
        },
      },
      h("span", { class: "conv-title-text" }, title),
    );
    const item = h(
      "li",
      { class: `conversation${current ? " is-current" : ""}`, "data-testid": "conversation", "data-conversation-id": c.id },
      link,
      h("span", { class: "live-dot", "aria-hidden": "true", title: "Replying" }),
      h("span", { class: "conv-actions" },
        h("button", { type: "button", class: "btn btn-icon btn-small", "data-testid": "rename-conversation", "aria-label": `Rename “${title}”`, title: "Rename", onclick: () => startRename(item, c) }, icon("pencil")),
        h("button", { type: "button", class: "btn btn-icon btn-small", "data-testid": "delete-conversation", "aria-label": `Delete “${title}”`, title: "Delete", onclick: () => confirmDelete(c) }, icon("trash")),
      ),
    );
    if (state.live.has(c.id)) item.classList.add("is-streaming");
    return item;
  });
  els.list.replaceChildren(...items);
  els.listEmpty.hidden = state.conversations.length > 0;
}

function startRename(item, c) {
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
        if (c.id === state.currentId) setTitle(conversationTitle(c));
        announce("Conversation renamed.");
      } catch (err) {
        announce(`Could not rename: ${err.detail || err.message}`);
      }
    }
    renderConversationList();
    els.list.querySelector(`[data-conversation-id="${CSS.escape(c.id)}"] [data-testid=rename-conversation]`)?.focus();
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

const confirmDialog = $("#confirm-dialog");
let pendingDelete = null;

function confirmDelete(c) {
  pendingDelete = c;
  $("#confirm-text").textContent = `“${conversationTitle(c)}” and all its messages will be deleted.`;
  confirmDialog.showModal();
  $("#confirm-delete").focus();
}

$("#confirm-delete").addEventListener("click", async () => {
  const c = pendingDelete;
  confirmDialog.close();
  if (!c) return;
  pendingDelete = null;
  liveFor(c.id)?.stream.stop();
  try {
    await api.del(`/api/conversations/${enc(c.id)}`);
  } catch (err) {
    if (err.status !== 404) {
      announce(`Could not delete: ${err.detail || err.message}`);
      return;
    }
  }
  state.conversations = state.conversations.filter((x) => x.id !== c.id);
  renderConversationList();
  announce("Conversation deleted.");
  if (state.currentId === c.id) {
    const next = state.conversations[0];
    if (next) openConversation(next.id);
    else showNoConversation();
  }
});

function showNoConversation() {
  state.currentId = null;
  state.loadSeq++;
  history.replaceState(null, "", location.pathname + location.search);
  setTitle(DEFAULT_TITLE);
  els.messages.replaceChildren(els.empty);
  updateEmptyState();
  renderConversationList();
  updateComposer();
}

/** Start a new conversation (reusing the current one if it is still empty). */
async function newChat() {
  closeSidebar();
  showComposerError("");
  const current = state.conversations.find((c) => c.id === state.currentId);
  const empty = !els.messages.querySelector("[data-testid=message]");
  if (current && empty && conversationTitle(current) === DEFAULT_TITLE) {
    els.input.focus();
    return;
  }
  try {
    const created = await api.post("/api/conversations", {});
    state.conversations.unshift(created);
    await openConversation(created.id, { fresh: true });
    announce("New conversation.");
  } catch (err) {
    showComposerError(`Could not start a conversation: ${err.detail || err.message}`);
  }
  els.input.focus();
}

/** Show a conversation: its stored messages, with live replies re-attached or resumed. */
async function openConversation(id, { fresh = false } = {}) {
  const seq = ++state.loadSeq;
  state.currentId = id;
  if (location.hash !== `#${id}`) history.replaceState(null, "", `#${id}`);
  const conv = state.conversations.find((c) => c.id === id);
  setTitle(conversationTitle(conv));
  renderConversationList();
  updateComposer();
  showComposerError("");
  if (fresh) {
    els.messages.replaceChildren(els.empty);
    updateEmptyState();
    return;
  }
  let data;
  try {
    data = await api.get(`/api/conversations/${enc(id)}`);
  } catch (err) {
    if (seq !== state.loadSeq) return;
    if (err instanceof ApiError && err.status === 404) {
      state.conversations = state.conversations.filter((c) => c.id !== id);
      showNoConversation();
      return;
    }
    els.messages.replaceChildren(h("p", { class: "load-error", role: "alert" }, `Could not load this conversation: ${err.detail || err.message}`));
    return;
  }
  if (seq !== state.loadSeq) return;
  if (data.title && conv) {
    conv.title = data.title;
    setTitle(conversationTitle(conv));
  }
  const live = liveFor(id);
  const nodes = [els.empty];
  const toResume = [];
  let liveShown = false;
  for (const row of data.messages || []) {
    if (row.role === "user") {
      if (live?.userView && live.userView.reply.messageId === String(row.id)) {
        nodes.push(live.userView.el);
        continue;
      }
      nodes.push(new MessageView("user", { text: row.content || "", status: row.status || "completed", messageId: row.id }).el);
    } else if (row.role === "assistant") {
      if (live && live.view.reply.messageId === String(row.id)) {
        nodes.push(live.view.el);
        liveShown = true;
        continue;
      }
      const view = new MessageView("assistant", ReplyState.fromRow(row));
      nodes.push(view.el);
      if (row.status === "streaming" && !live) toResume.push(view);
    }
  }
  if (live && !liveShown) {
    if (live.userView && !nodes.includes(live.userView.el)) nodes.push(live.userView.el);
    nodes.push(live.view.el);
  }
  els.messages.replaceChildren(...nodes);
  updateEmptyState();
  scrollToBottom();
  // A reply still being written (e.g. the page was reloaded mid-stream): pick it up where the
  // stored text ends. One at a time: the newest.
  const view = toResume.pop();
  if (view) runReply({ conversationId: id, view, request: { kind: "resume" } });
}

async function loadConversations() {
  try {
    state.conversations = (await api.get("/api/conversations")) || [];
  } catch (err) {
    els.listEmpty.textContent = `Could not load conversations: ${err.detail || err.message}`;
    els.listEmpty.hidden = false;
    return;
  }
  renderConversationList();
  const wanted = conversationIdFromHash(location.hash);
  const pick = state.conversations.find((c) => c.id === wanted) || state.conversations[0];
  if (pick) await openConversation(pick.id);
  else showNoConversation();
}

// ---------------------------------------------------------------------------------------------
// Sidebar (collapses behind a button on small screens)

function openSidebar() {
  document.body.classList.add("sidebar-open");
  els.sidebarToggle.setAttribute("aria-expanded", "true");
  els.backdrop.hidden = false;
  $("#new-chat").focus();
}

function closeSidebar() {
  if (!document.body.classList.contains("sidebar-open")) return;
  document.body.classList.remove("sidebar-open");
  els.sidebarToggle.setAttribute("aria-expanded", "false");
  els.backdrop.hidden = true;
}

els.sidebarToggle.addEventListener("click", () =>
  document.body.classList.contains("sidebar-open") ? closeSidebar() : openSidebar(),
);
$("#sidebar-close").addEventListener("click", () => {
  closeSidebar();
  els.sidebarToggle.focus();
});
els.backdrop.addEventListener("click", closeSidebar);

// ---------------------------------------------------------------------------------------------
// Account: log out, API keys

const accountDialog = $("#account-dialog");
const keyList = $("#key-list");

function showKeysError(text) {
  const p = $("#keys-error");
  p.textContent = text || "";
  p.hidden = !text;
}

function keyItem(k) {
  const created = k.created_at ? new Date(k.created_at).toLocaleDateString() : "";
  const used = k.last_used_at ? `last used ${new Date(k.last_used_at).toLocaleDateString()}` : "never used";
  const item = h(
    "li",
    { class: "key-item", "data-testid": "key-item", "data-key-id": k.id },
    h("span", { class: "key-name" }, k.name || "API key"),
    h("code", { class: "key-prefix", title: "The start of the key" }, `${k.prefix || ""}…`),
    h("span", { class: "muted key-dates" }, [created && `created ${created}`, used].filter(Boolean).join(" · ")),
    h("button", {
      type: "button", class: "btn btn-small btn-danger", "data-testid": "revoke-key", "aria-label": `Revoke key “${k.name || k.prefix}”`,
      onclick: async (e) => {
        e.currentTarget.disabled = true;
        try {
          await api.del(`/api/keys/${enc(k.id)}`);
          item.remove();
          $("#keys-empty").hidden = keyList.children.length > 0;
          announce("Key revoked.");
          $("#key-name").focus();
        } catch (err) {
          e.currentTarget.disabled = false;
          showKeysError(`Could not revoke: ${err.detail || err.message}`);
        }
      },
    }, "Revoke"),
  );
  return item;
}

async function loadKeys() {
  showKeysError("");
  try {
    const keys = (await api.get("/api/keys")) || [];
    keyList.replaceChildren(...keys.filter((k) => !k.revoked_at).map(keyItem));
  } catch (err) {
    showKeysError(`Could not load keys: ${err.detail || err.message}`);
  }
  $("#keys-empty").hidden = keyList.children.length > 0;
}

$("#open-account").addEventListener("click", () => {
  forgetNewKey();
  accountDialog.showModal();
  loadKeys();
});

$("#key-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  showKeysError("");
  const nameInput = $("#key-name");
  const button = e.submitter || e.currentTarget.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const key = await api.post("/api/keys", { name: nameInput.value.trim() || "API key" });
    $("#new-key-secret").textContent = key.secret;
    $("#new-key").hidden = false;
    keyList.prepend(keyItem(key));
    $("#keys-empty").hidden = true;
    nameInput.value = "";
    $("#new-key-secret").focus();
  } catch (err) {
    showKeysError(`Could not create a key: ${err.detail || err.message}`);
  } finally {
    button.disabled = false;
  }
});

$("#copy-key").addEventListener("click", async (e) => {
  flash(e.currentTarget, (await copyText($("#new-key-secret").textContent)) ? "Copied" : "Copy failed");
});

for (const dialog of [accountDialog, confirmDialog]) {
  dialog.addEventListener("click", (e) => {
    if (e.target.closest("[data-close]") || e.target === dialog) dialog.close();
  });
}

// The secret is shown once: do not leave it in the page. "close" arrives as a later task, after
// the dialog is already hidden; Esc fires "cancel" first, synchronously, so wipe on both.
function forgetNewKey() {
  $("#new-key-secret").textContent = "";
  $("#new-key").hidden = true;
}
accountDialog.addEventListener("cancel", forgetNewKey);
accountDialog.addEventListener("close", forgetNewKey);

$("#logout").addEventListener("click", async () => {
  try {
    await api.post("/api/auth/logout", {});
  } catch {
    /* logged out or not, leave */
  }
  location.assign("/login");
});

// ---------------------------------------------------------------------------------------------
// Composer, keyboard, scrolling, connectivity

function autosize() {
  els.input.style.height = "auto";
  els.input.style.height = `${Math.min(els.input.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
}

els.form.addEventListener("submit", (e) => {
  e.preventDefault();
  if (liveFor(state.currentId)) {
    stopCurrent();
    return;
  }
  const content = els.input.value;
  if (!content.trim()) {
    els.input.focus();
    return;
  }
  const t0 = performance.now();
  els.input.value = "";
  autosize();
  send(content, { t0 });
  els.input.focus();
});

els.input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
    e.preventDefault();
    if (!liveFor(state.currentId)) els.form.requestSubmit();
  }
});
els.input.addEventListener("input", () => {
  autosize();
  if (!els.composerError.hidden) showComposerError("");
});

document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.defaultPrevented) return;
  if (accountDialog.open || confirmDialog.open) return; // the dialog closes itself
  if (document.body.classList.contains("sidebar-open")) {
    closeSidebar();
    els.sidebarToggle.focus();
    return;
  }
  if (liveFor(state.currentId)) {
    e.preventDefault();
    stopCurrent();
  }
});

els.messages.addEventListener("scroll", () => {
  state.stick = atBottom();
  if (state.stick) els.jump.hidden = true;
});
els.jump.addEventListener("click", () => {
  scrollToBottom();
  els.input.focus();
});

els.messages.addEventListener("click", async (e) => {
  const button = e.target.closest(".code-copy");
  if (!button) return;
  const code = button.closest("pre")?.querySelector("code");
  const ok = await copyText(code ? code.textContent : "");
  button.dataset.copied = ok ? "yes" : "no";
  setTimeout(() => delete button.dataset.copied, 1500);
});

els.transport.value = localStorage.getItem(TRANSPORT_KEY) === "ws" ? "ws" : "sse";
els.transport.addEventListener("change", () => {
  localStorage.setItem(TRANSPORT_KEY, transportName());
  announce(`Replies will stream over ${transportName() === "ws" ? "WebSocket" : "SSE"}.`);
});

function showNetStatus() {
  const offline = navigator.onLine === false;
  els.net.textContent = offline ? "You are offline. Replies will resume when the connection is back." : "";
  els.net.hidden = !offline;
}

window.addEventListener("offline", () => {
  showNetStatus();
  // Do not wait for a dead connection to time out: drop it, and resume once back online.
  for (const live of state.live.values()) live.stream.interrupt();
});
window.addEventListener("online", showNetStatus);

window.addEventListener("hashchange", () => {
  const id = conversationIdFromHash(location.hash);
  if (id && id !== state.currentId && state.conversations.some((c) => c.id === id)) openConversation(id);
});

$("#new-chat").addEventListener("click", newChat);

// ---------------------------------------------------------------------------------------------

showNetStatus();
updateComposer();
loadConversations().then(() => {
  if (root) root.dataset.ready = "true";
});
// Focus the composer, except on touch screens, where that would pop the keyboard up at once.
if (window.matchMedia("(pointer: fine)").matches) els.input.focus();
