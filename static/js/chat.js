/**
 * The chat page, wired together: the conversation list in the sidebar (conversation-list.js,
 * sidebar.js), the messages of the open conversation (message-list.js, message-view.js), the
 * composer whose Send turns into Stop while a reply streams (composer.js), the replies themselves
 * (replies.js over stream.js and a transport, SSE or WebSocket, as the toggle says) and the
 * account dialog (account.js).
 *
 * This module holds which conversation is open and loads it; the components do the rest. Model
 * and user text only ever reach the page as text nodes (markdown.js builds elements from an
 * allowlist; nothing uses innerHTML).
 */

import { api, ApiError, enc, setUnauthorizedHandler } from "./api.js";
import { AccountDialog } from "./account.js";
import { Composer } from "./composer.js";
import { ConversationList, conversationTitle, DEFAULT_TITLE } from "./conversation-list.js";
import { $, announcer } from "./dom.js";
import { MessageList } from "./message-list.js";
import { MessageView } from "./message-view.js";
import { ReplyState } from "./reply.js";
import { Replies } from "./replies.js";
import { conversationIdFromHash } from "./route.js";
import { Sidebar } from "./sidebar.js";
import { SseTransport } from "./transport-sse.js";
import { WsTransport } from "./transport-ws.js";

const TRANSPORT_KEY = "streamchat.transport";

const root = $("#app");
const title = $("#conv-title");
const transportSelect = $("#transport");
const netStatus = $("#net-status");
const announce = announcer($("#sr-status"));
let loadSeq = 0; // a conversation load that a later one overtook is dropped

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
  return transportSelect.value === "ws" ? "ws" : "sse";
}

// ---------------------------------------------------------------------------------------------
// The components

const sidebar = new Sidebar({
  toggle: $("#sidebar-toggle"),
  close: $("#sidebar-close"),
  backdrop: $("#backdrop"),
  first: $("#new-chat"),
});

const conversations = new ConversationList({
  list: $("#conversation-list"),
  empty: $("#conversations-empty"),
  confirm: $("#confirm-dialog"),
  isLive: (id) => !!replies.liveFor(id),
  announce,
  onOpen(id) {
    openConversation(id);
    sidebar.close();
  },
  onTitle(c) {
    if (c.id === conversations.currentId) setTitle(conversationTitle(c));
  },
  onDeleting: (c) => replies.stop(c.id),
  onDeleted(c) {
    if (conversations.currentId !== c.id) return;
    const next = conversations.items[0];
    if (next) openConversation(next.id);
    else showNoConversation();
  },
});

const messages = new MessageList({
  el: $("#messages"),
  empty: $("#empty-state"),
  jump: $("#jump-latest"),
  onJump: () => composer.focus(),
});

const composer = new Composer({
  form: $("#composer-form"),
  input: $("#composer"),
  send: $("#send"),
  error: $("#composer-error"),
  isBusy: () => !!replies.liveFor(conversations.currentId),
  onSend: (content, t0) => send(content, { t0 }),
  onStop: stopCurrent,
});

const replies = new Replies({
  list: messages,
  composer,
  transport: () => transports[transportName()],
  announce,
  onStarted: (id, content) => conversations.touch(id, content),
  onLive: showLive,
});

const account = new AccountDialog({
  dialog: $("#account-dialog"),
  openButton: $("#open-account"),
  logout: $("#logout"),
  announce,
});

messages.el.addEventListener("message-retry", (e) => replies.retry(conversations.currentId, e.detail.view));
messages.el.addEventListener("message-regenerate", (e) => replies.regenerate(conversations.currentId, e.detail.view));

/** Send or Stop, and the dots in the list, as the replies now stand. */
function showLive() {
  composer.setStreaming(!!replies.liveFor(conversations.currentId));
  conversations.markStreaming();
}

function setTitle(text) {
  title.textContent = text;
  title.title = text; // the whole title on hover, where it is cut short
  document.title = `${text} · StreamChat`;
}

// ---------------------------------------------------------------------------------------------
// Sending and stopping

async function send(content, { t0 = performance.now() } = {}) {
  composer.showError("");
  if (!content.trim()) return;
  let conversationId = conversations.currentId;
  if (conversationId && replies.liveFor(conversationId)) return; // one reply at a time per conversation
  if (!conversationId) {
    try {
      const created = await api.post("/api/conversations", {});
      conversations.add(created);
      conversationId = created.id;
      await openConversation(conversationId, { fresh: true });
    } catch (err) {
      composer.showError(`Could not start a conversation: ${err.detail || err.message}`);
      return;
    }
  }
  await replies.send(conversationId, content, { t0 });
}

function stopCurrent() {
  if (replies.stop(conversations.currentId)) composer.focus();
}

// ---------------------------------------------------------------------------------------------
// Which conversation is open

function showNoConversation() {
  conversations.currentId = null;
  loadSeq++;
  history.replaceState(null, "", location.pathname + location.search);
  setTitle(DEFAULT_TITLE);
  messages.show();
  conversations.render();
  showLive();
}

/** Start a new conversation (reusing the current one if it is still empty). */
async function newChat() {
  sidebar.close();
  composer.showError("");
  const current = conversations.find(conversations.currentId);
  if (current && !messages.hasMessages() && conversationTitle(current) === DEFAULT_TITLE) {
    composer.focus();
    return;
  }
  try {
    const created = await api.post("/api/conversations", {});
    conversations.add(created);
    await openConversation(created.id, { fresh: true });
    announce("New conversation.");
  } catch (err) {
    composer.showError(`Could not start a conversation: ${err.detail || err.message}`);
  }
  composer.focus();
}

/** The message elements of a loaded conversation, with its live reply's views in their place. */
function messageNodes(rows, live) {
  const nodes = [];
  const toResume = [];
  for (const row of rows) {
    const liveView = row.role === "user" ? live?.userView : live?.view;
    if (liveView && liveView.reply.messageId === String(row.id)) nodes.push(liveView.el);
    else if (row.role === "user") {
      nodes.push(new MessageView("user", { text: row.content || "", status: row.status || "completed", messageId: row.id }).el);
    } else if (row.role === "assistant") {
      const view = new MessageView("assistant", ReplyState.fromRow(row));
      nodes.push(view.el);
      if (row.status === "streaming" && !live) toResume.push(view);
    }
  }
  // A reply sent from this page whose rows the server did not list yet.
  if (live && !nodes.includes(live.view.el)) {
    if (live.userView && !nodes.includes(live.userView.el)) nodes.push(live.userView.el);
    nodes.push(live.view.el);
  }
  return { nodes, toResume };
}

/** Show a conversation: its stored messages, with live replies re-attached or resumed. */
async function openConversation(id, { fresh = false } = {}) {
  const seq = ++loadSeq;
  conversations.currentId = id;
  if (location.hash !== `#${id}`) history.replaceState(null, "", `#${id}`);
  const conv = conversations.find(id);
  setTitle(conversationTitle(conv));
  conversations.render();
  showLive();
  composer.showError("");
  if (fresh) {
    messages.show();
    return;
  }
  let data;
  try {
    data = await api.get(`/api/conversations/${enc(id)}`);
  } catch (err) {
    if (seq !== loadSeq) return;
    if (err instanceof ApiError && err.status === 404) {
      conversations.forget(id);
      showNoConversation();
      return;
    }
    messages.showLoadError(`Could not load this conversation: ${err.detail || err.message}`);
    return;
  }
  if (seq !== loadSeq) return;
  if (data.title && conv) {
    conv.title = data.title;
    setTitle(conversationTitle(conv));
  }
  const { nodes, toResume } = messageNodes(data.messages || [], replies.liveFor(id));
  messages.show(nodes);
  messages.scrollToBottom();
  // A reply still being written (e.g. the page was reloaded mid-stream): pick it up where the
  // stored text ends. One at a time: the newest.
  const view = toResume.pop();
  if (view) replies.run({ conversationId: id, view, request: { kind: "resume" } });
}

async function loadConversations() {
  try {
    conversations.items = (await api.get("/api/conversations")) || [];
  } catch (err) {
    conversations.showLoadError(`Could not load conversations: ${err.detail || err.message}`);
    return;
  }
  conversations.render();
  const wanted = conversationIdFromHash(location.hash);
  const pick = conversations.find(wanted) || conversations.items[0];
  if (pick) await openConversation(pick.id);
  else showNoConversation();
}

// ---------------------------------------------------------------------------------------------
// Keyboard, transport, connectivity, the address bar

document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.defaultPrevented) return;
  if (account.open || conversations.confirm.open) return; // the dialog closes itself
  if (sidebar.isOpen) {
    sidebar.dismiss();
    return;
  }
  if (replies.liveFor(conversations.currentId)) {
    e.preventDefault();
    stopCurrent();
  }
});

transportSelect.value = localStorage.getItem(TRANSPORT_KEY) === "ws" ? "ws" : "sse";
transportSelect.addEventListener("change", () => {
  localStorage.setItem(TRANSPORT_KEY, transportName());
  announce(`Replies will stream over ${transportName() === "ws" ? "WebSocket" : "SSE"}.`);
});

function showNetStatus() {
  const offline = navigator.onLine === false;
  netStatus.textContent = offline ? "You are offline. Replies will resume when the connection is back." : "";
  netStatus.hidden = !offline;
}

window.addEventListener("offline", () => {
  showNetStatus();
  // Do not wait for a dead connection to time out: drop it, and resume once back online.
  replies.interruptAll();
});
window.addEventListener("online", showNetStatus);

window.addEventListener("hashchange", () => {
  const id = conversationIdFromHash(location.hash);
  if (id && id !== conversations.currentId && conversations.find(id)) openConversation(id);
});

$("#new-chat").addEventListener("click", newChat);

// ---------------------------------------------------------------------------------------------

showNetStatus();
showLive();
loadConversations().then(() => {
  if (root) root.dataset.ready = "true";
});
// Focus the composer, except on touch screens, where that would pop the keyboard up at once.
if (window.matchMedia("(pointer: fine)").matches) composer.focus();
