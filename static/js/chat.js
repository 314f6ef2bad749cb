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
import { showVersions } from "./branches.js";
import { Composer } from "./composer.js";
import { ExportMenu, ImportButton } from "./conversation-export.js";
import { ConversationList, conversationTitle, DEFAULT_TITLE } from "./conversation-list.js";
import { $, announcer } from "./dom.js";
import { MessageList } from "./message-list.js";
import { MessageView } from "./message-view.js";
import { Push } from "./push.js";
import { announceRatingsWith, loadRatings } from "./rating.js";
import { ReplyState } from "./reply.js";
import { SettingsPanel } from "./settings-panel.js";
import { Replies } from "./replies.js";
import { conversationIdFromHash } from "./route.js";
import { SearchBox } from "./search-box.js";
import { Sidebar } from "./sidebar.js";
import { TabSync } from "./tab-sync.js";
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
  isLive: (id) => !!replies.liveFor(id) || sync.isLive(id),
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

// The user's other tabs and devices: their events over the page's one push channel.
const sync = new TabSync({
  conversations,
  replies,
  reload: (id) => openConversation(id),
  onGone: (c) => conversations.onDeleted(c),
});
const push = new Push({
  ws: transports.ws,
  onEvent: (ev) => sync.handle(ev),
  onConnected(again) {
    if (root) root.dataset.push = "connected"; // for the tests: this page hears the others now
    if (again) sync.resync();
  },
});

const account = new AccountDialog({
  dialog: $("#account-dialog"),
  openButton: $("#open-account"),
  logout: $("#logout"),
  announce,
});

new SettingsPanel({
  dialog: $("#settings-dialog"),
  openButton: $("#open-settings"),
  currentId: () => conversations.currentId,
  ensureConversation,
  announce,
});

/** The open conversation's id, starting one first if none is open (for its settings). */
async function ensureConversation() {
  if (conversations.currentId) return conversations.currentId;
  const created = await api.post("/api/conversations", {});
  conversations.add(created);
  await openConversation(created.id, { fresh: true });
  return created.id;
}

// Both replace the reply whose button was pressed: the focus goes to the composer, not to <body>.
messages.el.addEventListener("message-retry", (e) => {
  replies.retry(conversations.currentId, e.detail.view);
  composer.focus();
});
messages.el.addEventListener("message-regenerate", (e) => {
  replies.regenerate(conversations.currentId, e.detail.view);
  composer.focus();
});

const search = new SearchBox({
  input: $("#conversation-search"),
  results: $("#search-results"),
  empty: $("#search-empty"),
  list: $("#conversation-nav"),
  area: $("#search-area"),
  announce,
  onOpen(id) {
    openConversation(id);
    sidebar.close();
  },
});

const exportMenu = new ExportMenu({ menu: $("#export-menu"), markdown: $("#export-md"), json: $("#export-json") });

new ImportButton({
  button: $("#import-conversation"),
  file: $("#import-file"),
  error: $("#import-error"),
  announce,
  onImported(created) {
    search.clear();
    conversations.add(created);
    openConversation(created.id);
    sidebar.close();
  },
});
announceRatingsWith(announce);

messages.el.addEventListener("message-edit", (e) => editMessage(e.detail.view, e.detail.content));
messages.el.addEventListener("message-branch", (e) => showBranch(e.detail.messageId, e.detail.which));

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

/** Versions wait for the reply: the page shows one branch, and the live reply is on it. */
function refuseWhileLive(what) {
  if (!replies.liveFor(conversations.currentId)) return false;
  composer.showError(`Wait for the reply to finish (or stop it) before ${what}.`);
  return true;
}

function editMessage(view, content) {
  composer.showError("");
  if (!conversations.currentId || !content.trim() || refuseWhileLive("editing a message")) {
    view.update();
    return;
  }
  replies.edit(conversations.currentId, view, content);
}

/** Show another version of a message (and the branch below it); the server remembers it. */
async function showBranch(messageId, which) {
  const id = conversations.currentId;
  if (!id || refuseWhileLive("switching versions")) return;
  composer.showError("");
  let data;
  try {
    data = await api.patch(`/api/conversations/${enc(id)}/branch`, { message_id: messageId });
  } catch (err) {
    composer.showError(`Could not show that version: ${err.detail || err.message}`);
    return;
  }
  if (id !== conversations.currentId) return;
  loadSeq++; // a load still in flight would show the branch as it was
  showMessages(id, data);
  loadRatings(id, messages.el).catch(() => {}); // the replies just shown are new views
  // Keep the reader where they were: on the message they switched, its same button focused.
  const shown = messages.el.querySelector(`[data-message-id="${messageId}"]`);
  shown?.scrollIntoView({ block: "nearest" });
  const buttons = [`[data-testid=branch-${which}]`, "[data-testid=branch-switcher] button"];
  const button = buttons.map((s) => shown?.querySelector(`${s}:not([disabled])`)).find(Boolean);
  button?.focus();
  announce(`Showing version ${shown?.querySelector("[data-testid=branch-position]")?.textContent || ""}.`);
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
  exportMenu.show(null);
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
      const view = new MessageView("user", { text: row.content || "", status: row.status || "completed", messageId: row.id });
      showVersions(view, row.siblings);
      nodes.push(view.el);
    } else if (row.role === "assistant") {
      const view = new MessageView("assistant", ReplyState.fromRow(row));
      showVersions(view, row.siblings);
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

/** Show a loaded conversation's messages; returns the views of replies still being written. */
function showMessages(id, data) {
  const conv = conversations.find(id);
  if (data.title && conv) {
    conv.title = data.title;
    setTitle(conversationTitle(conv));
  }
  const { nodes, toResume } = messageNodes(data.messages || [], replies.liveFor(id));
  messages.show(nodes);
  return toResume;
}

/** Show a conversation: its stored messages, with live replies re-attached or resumed. */
async function openConversation(id, { fresh = false } = {}) {
  const seq = ++loadSeq;
  conversations.currentId = id;
  if (location.hash !== `#${id}`) history.replaceState(null, "", `#${id}`);
  const conv = conversations.find(id);
  exportMenu.show(id);
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
  const toResume = showMessages(id, data);
  messages.scrollToBottom();
  // A reply still being written (e.g. the page was reloaded mid-stream): pick it up where the
  // stored text ends. One at a time: the newest.
  const view = toResume.pop();
  if (view) replies.run({ conversationId: id, view, request: { kind: "resume" } });
  loadRatings(id, messages.el).catch(() => {}); // the thumbs show unrated until it answers
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
  push.use(transportName());
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
  push.use(transportName());
  if (root) root.dataset.ready = "true";
});
// Focus the composer, except on touch screens, where that would pop the keyboard up at once.
if (window.matchMedia("(pointer: fine)").matches) composer.focus();
