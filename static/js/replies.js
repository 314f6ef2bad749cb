/**
 * The page's replies: send, regenerate, edit, retry, resume and Stop, one live reply per
 * conversation.
 * Each runs a ReplyStream (stream.js) over the chosen transport and keeps its MessageView up to
 * date; a reply keeps streaming while the user looks at another conversation, and its view is
 * shown again when they come back (`liveFor`).
 */

import { api, enc } from "./api.js";
import { withNewVersion } from "./branches.js";
import { MessageView } from "./message-view.js";
import { FINAL_STATUSES, ReplyState } from "./reply.js";
import { ReplyStream } from "./stream.js";

export class Replies {
  /**
   * @param list       the MessageList the views go into
   * @param composer   the Composer (its error line; a refused message goes back into it)
   * @param transport  () => the transport a new reply uses
   * @param announce   reads a short status out to screen readers
   * @param onStarted  (conversationId, content or null): the server took the message
   * @param onLive     (): a reply started or ended (Send/Stop, the list's dots)
   * @param onStale    (conversationId): a send was refused because the conversation moved on
   *                   elsewhere (409): show it as it is now
   */
  constructor({ list, composer, transport, announce, onStarted, onLive, onStale = () => {} }) {
    Object.assign(this, { list, composer, transport, announce, onStarted, onLive, onStale });
    this.live = new Map(); // conversationId -> {stream, view, userView}
  }

  liveFor(conversationId) {
    return this.live.get(conversationId) || null;
  }

  /** The browser went offline: drop every connection now, and resume once back online. */
  interruptAll() {
    for (const live of this.live.values()) live.stream.interrupt();
  }

  stop(conversationId) {
    const live = this.liveFor(conversationId);
    if (live) live.stream.stop();
    return !!live;
  }

  /**
   * Run a reply's stream and keep its view up to date.
   * @param request  {kind: "send", conversationId, content, parentId}, {kind: "regenerate", messageId},
   *                 {kind: "edit", messageId, content} or {kind: "resume"}
   * @param replaces the reply a regenerate replaces: back in its place if the server refuses
   * @param t0       performance.now() when the user pressed Send (for the page's TTFT), or null
   * @param started  (state) => void, once the server named the reply (and its question)
   */
  run({ conversationId, view, userView = null, replaces = null, request, t0 = null, started = null }) {
    const { list, composer, announce } = this;
    const transport = this.transport();
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
        onStart: (s) => {
          view.setMessageId(s.messageId);
          if (userView) {
            userView.setMessageId(s.userMessageId);
            userView.reply.status = "completed";
            userView.update();
          }
          view.setReconnecting(null);
          started?.(s);
          this.onStarted(conversationId, request.kind === "send" ? request.content : null);
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
          view.stopError = null;
          view.update();
        },
        onStopFailed(_s, err) {
          view.stopping = false;
          view.stopError = err?.detail || err?.message || "no answer from the server";
          view.update();
          announce("Could not stop the reply. It is still being written.");
        },
        onRejected: (s, err) => {
          // First, since it clears the composer's error line: the page missed a turn added
          // elsewhere, so it shows the conversation as it is now.
          if (request.kind === "send" && err?.status === 409) this.onStale(conversationId);
          if (replaces) view.el.replaceWith(replaces.el);
          else view.el.remove();
          userView?.el.remove();
          list.updateEmptyState();
          if (request.kind === "send") composer.restore(request.content);
          composer.showError(s.error || err.message);
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
          announce(view.spokenText());
        },
      },
    });
    view.stream = stream;
    this.live.set(conversationId, { stream, view, userView });
    this.onLive();
    return stream.run().finally(() => {
      if (this.live.get(conversationId)?.stream === stream) this.live.delete(conversationId);
      this.onLive();
      document.dispatchEvent(new Event("reply-ended")); // its tokens count: the quota notice
    });
  }

  /** Send `content` in an existing conversation: the user's message and the reply appear below,
   * after the last message shown (the server builds the prompt from the branch on this screen). */
  async send(conversationId, content, { t0 = performance.now() } = {}) {
    const parentId = this.list.lastShownId();
    const userView = new MessageView("user", { text: content, status: "sending", messageId: null });
    const view = new MessageView("assistant", new ReplyState({ conversationId }));
    this.list.append(userView);
    this.list.append(view);
    this.list.scrollToBottom();
    this.announce("Sent. The assistant is replying.");
    await this.run({ conversationId, view, userView, request: { kind: "send", conversationId, content, parentId }, t0 });
  }

  /** Answer the latest reply's question again: a new version of the reply takes its place on
   * screen (the old one is a version away). */
  regenerate(conversationId, view) {
    if (this.liveFor(conversationId)) return;
    if (!view.reply.messageId || !this.list.isLatest(view)) {
      this.composer.showError("Only the latest reply can be regenerated.");
      return;
    }
    this.composer.showError("");
    const fresh = new MessageView("assistant", new ReplyState({ conversationId }));
    view.el.replaceWith(fresh.el);
    this.list.scrollToBottom();
    this.announce("Regenerating the reply.");
    return this.run({
      conversationId,
      view: fresh,
      replaces: view,
      request: { kind: "regenerate", messageId: view.reply.messageId },
      t0: performance.now(),
      started: (s) => {
        fresh.siblings = withNewVersion(view, s.messageId); // a new version, next to the old
        fresh.update();
      },
    });
  }

  /**
   * Send `content` as a new version of the user's message `view`: it and everything after it
   * give way to the new version and its streaming reply (they stay on the server, a version
   * away), and come back if the server refuses.
   */
  async edit(conversationId, view, content) {
    if (this.liveFor(conversationId) || !view.reply.messageId) return;
    const old = [];
    for (let node = view.el; node; node = node.nextElementSibling) old.push(node);
    const userView = new MessageView("user", { text: content, status: "sending", messageId: null });
    const reply = new MessageView("assistant", new ReplyState({ conversationId }));
    for (const node of old) node.remove();
    this.list.append(userView);
    this.list.append(reply);
    this.list.scrollToBottom();
    this.announce("Sent the edited message. The assistant is replying.");
    const state = await this.run({
      conversationId,
      view: reply,
      userView,
      request: { kind: "edit", messageId: view.reply.messageId, content },
      t0: performance.now(),
      started: (s) => {
        userView.siblings = withNewVersion(view, s.userMessageId);
        userView.update();
      },
    });
    if (state?.status === "rejected") this.list.el.append(...old);
    this.list.updateEmptyState();
  }

  /** Retry a failed or truncated reply: resume it, send its words again, or regenerate it. */
  retry(conversationId, view) {
    const r = view.reply;
    if (this.liveFor(conversationId)) return;
    if (r.status === "truncated" && r.messageId) {
      // The server may still have the rest: resume from what we have.
      this.run({ conversationId, view, request: { kind: "resume" } });
      return;
    }
    const prompt = this.list.promptFor(view);
    if (r.notSent && prompt) {
      // Nothing reached the server (as far as we know): send the same words again, in place.
      prompt.el.remove();
      view.el.remove();
      this.composer.showError("");
      this.send(conversationId, prompt.text);
      return;
    }
    this.regenerate(conversationId, view);
  }
}
