/**
 * The chat page, wired together: the conversation list in the sidebar (conversation-list.js,
 * sidebar.js), the messages of the open conversation (message-list.js, message-view.js), the
 * composer whose Send turns into Stop while a reply streams (composer.js), the replies themselves
 * (replies.js over stream.js and a transport, SSE or WebSocket, as the toggle says), the thread's
 * views and versions (thread.js, branches.js), the push channel from the user's other tabs
 * (push.js, tab-sync.js), search, export and ratings, the settings panel and the account dialog.
 *
 * This module holds which conversation is open and loads it; the components do the rest. Model
 * and user text only ever reach the page as text nodes (markdown.js builds elements from an
 * allowlist; nothing uses innerHTML).
 */

import { api, ApiError, enc } from "./api.js";
import { AccountDialog } from "./account.js";
import { ArchivedNote } from "./archived-note.js";
import { Composer } from "./composer.js";
import { ConversationList, conversationTitle, DEFAULT_TITLE } from "./conversation-list.js";
import { $, announcer } from "./dom.js";
import { findAndKeep } from "./find-and-keep.js";
import { MessageList } from "./message-list.js";
import { OlderMessages, RENDER_STEP } from "./older-messages.js";
import { watchConnectivity } from "./net-status.js";
import { loadRatings } from "./rating.js";
import { watchQuota } from "./quota.js";
import { SettingsPanel } from "./settings-panel.js";
import { Replies } from "./replies.js";
import { conversationIdFromHash } from "./route.js";
import { leaveWhenSignedOut } from "./sign-out.js";
import { Sidebar } from "./sidebar.js";
import { TopbarMenu } from "./topbar-menu.js";
import { hearOtherTabs } from "./tab-sync.js";
import { messageNodes, Versions } from "./thread.js";
import { TransportChoice } from "./transport-choice.js";
import { SseTransport } from "./transport-sse.js";
import { WsTransport } from "./transport-ws.js";

const root = $("#app");
const title = $("#conv-title");
const announce = announcer($("#sr-status"));
watchQuota($("#composer-quota"));
let loadSeq = 0; // a conversation load that a later one overtook is dropped

const signedOut = leaveWhenSignedOut({ root, announce }); // 401s, `signed_out`, a 4401 close

const transports = {
  sse: new SseTransport(),
  ws: new WsTransport({ onUnauthorized: () => signedOut() }),
};

const transport = new TransportChoice($("#transport"), (name) => {
  push.use(name);
  announce(`Replies will stream over ${name === "ws" ? "WebSocket" : "SSE"}.`);
});

// ---------------------------------------------------------------------------------------------
// The components

new TopbarMenu({ button: $("#topbar-more"), panel: $("#topbar-tools") });

const sidebar = new Sidebar({
  toggle: $("#sidebar-toggle"),
  close: $("#sidebar-close"),
  backdrop: $("#backdrop"),
  first: $("#new-chat"),
});

const conversations = new ConversationList({
  list: $("#conversation-list"),
  empty: $("#conversations-empty"),
  older: $("#older-conversations"),
  archivedToggle: $("#show-archived"),
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
  onFiled(c) {
    if (c.id === conversations.currentId) archivedNote.show(c);
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

const older = new OlderMessages({
  list: messages,
  render: (rows) => messageNodes(rows, null).nodes,
  onDrawn: (id) => loadRatings(id, messages.el).catch(() => {}), // the replies just drawn
  onStale: (id) => id === conversations.currentId && openConversation(id),
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
  transport: () => transports[transport.name],
  announce,
  onStarted(id, content) {
    conversations.touch(id, content);
    if (id === conversations.currentId) archivedNote.show(null); // a new turn unarchives it
  },
  onLive: showLive,
  onStale: (id) => id === conversations.currentId && openConversation(id),
});

// The user's other tabs and devices: their events over the page's one push channel.
const { sync, push } = hearOtherTabs({
  ws: transports.ws,
  root,
  conversations,
  replies,
  reload: (id) => openConversation(id),
  onGone: (c) => conversations.onDeleted(c),
  shownLeaf: () => messages.lastShownId(),
  onSignedOut: signedOut,
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
  return conversations.currentId || startConversation();
}

/** A new conversation, listed and opened (empty); its id. */
async function startConversation() {
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

const { exportMenu } = findAndKeep({
  announce,
  add: (created) => conversations.add(created),
  open(id) {
    openConversation(id);
    sidebar.close();
  },
});

const versions = new Versions({
  conversations,
  replies,
  composer,
  messages,
  announce,
  onShown(id, data) {
    loadSeq++; // a load still in flight would show the branch as it was
    showMessages(id, data, { atLeast: messages.el.querySelectorAll("[data-testid=message]").length });
    loadRatings(id, messages.el).catch(() => {}); // the replies just shown are new views
  },
});
messages.el.addEventListener("message-edit", (e) => versions.edit(e.detail.view, e.detail.content));
messages.el.addEventListener("message-branch", (e) => versions.show(e.detail.messageId, e.detail.which));

/** Send or Stop, and the dots in the list, as the replies now stand. */
function showLive() {
  composer.setStreaming(!!replies.liveFor(conversations.currentId));
  conversations.markStreaming();
}

const archivedNote = new ArchivedNote({
  note: $("#archived-note"),
  button: $("#unarchive"),
  current: () => conversations.currentId,
  onFresh: (c) => conversations.filed(c),
  announce,
  onDone: () => composer.focus(),
});

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
      conversationId = await startConversation();
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
  exportMenu.show(null);
  setTitle(DEFAULT_TITLE);
  archivedNote.show(null);
  messages.show();
  older.reset(null, [], 0);
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
    await startConversation();
    announce("New conversation.");
  } catch (err) {
    composer.showError(`Could not start a conversation: ${err.detail || err.message}`);
  }
  composer.focus();
}

/** Show a loaded conversation's messages, the newest first (older-messages.js draws the rest as
 * the reader scrolls up; `atLeast`: as many as were drawn before); returns the views of replies
 * still being written. */
function showMessages(id, data, { atLeast = 0 } = {}) {
  const conv = conversations.find(id);
  if (conv && data.title) conv.title = data.title;
  if (data.title) setTitle(data.title); // (not listed yet: an old one, opened by its address)
  archivedNote.show(data);
  const rows = data.messages || [];
  const split = Math.max(0, rows.length - Math.max(RENDER_STEP, atLeast));
  const { nodes, toResume } = messageNodes(rows.slice(split), replies.liveFor(id));
  messages.show(nodes);
  older.reset(id, rows.slice(0, split), data.earlier || 0, rows[split]?.id);
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
  archivedNote.show(conv);
  conversations.render();
  showLive();
  composer.showError("");
  if (fresh) {
    messages.show();
    older.reset(id, [], 0);
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
    await conversations.load();
  } catch (err) {
    conversations.showLoadError(`Could not load conversations: ${err.detail || err.message}`);
    return;
  }
  conversations.render();
  const wanted = conversationIdFromHash(location.hash);
  // An old conversation, past the list's first page, opens by its address all the same.
  let pick = conversations.find(wanted)?.id;
  if (!pick && wanted) {
    pick = await api.get(`/api/conversations/${enc(wanted)}?limit=1`).then(() => wanted, () => null);
  }
  pick ||= conversations.items[0]?.id;
  if (pick) await openConversation(pick);
  else showNoConversation();
}

// ---------------------------------------------------------------------------------------------
// Keyboard, connectivity, the address bar

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

// Do not wait for a dead connection to time out: drop it, and resume once back online.
watchConnectivity($("#net-status"), () => replies.interruptAll());

window.addEventListener("hashchange", () => {
  const id = conversationIdFromHash(location.hash);
  if (id && id !== conversations.currentId && conversations.find(id)) openConversation(id);
});

$("#new-chat").addEventListener("click", newChat);

// ---------------------------------------------------------------------------------------------

showLive();
loadConversations().then(() => {
  push.use(transport.name);
  if (root) root.dataset.ready = "true";
});
// Focus the composer, except on touch screens, where that would pop the keyboard up at once.
if (window.matchMedia("(pointer: fine)").matches) composer.focus();
