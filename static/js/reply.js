/**
 * The state of one assistant reply as the page sees it, independent of transport and DOM.
 *
 * Event ids are character offsets (Unicode code points, as Python counts them) where a delta's
 * text ends. The page keeps the last offset it has and resumes from it; `delta()` also drops any
 * text it already has (a replayed or overlapping delta), so text is never shown twice.
 */

export const FINAL_STATUSES = new Set(["completed", "length", "cancelled", "disconnected", "failed", "interrupted"]);

/** Length in code points (what the server's offsets count), not UTF-16 units. */
export function cpLen(s) {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/** `s` without its first `n` code points. */
export function cpSkip(s, n) {
  if (n <= 0) return s;
  let i = 0;
  for (const ch of s) {
    if (n-- <= 0) break;
    i += ch.length;
  }
  return s.slice(i);
}

/** Exponential backoff with jitter: 0.5 s, 1 s, 2 s, ... capped. attempt starts at 1. */
export function backoffDelay(attempt, { base = 500, max = 15000, jitter = 0.25, random = Math.random } = {}) {
  const raw = Math.min(max, base * 2 ** Math.max(0, attempt - 1));
  return Math.round(raw * (1 - jitter + 2 * jitter * random()));
}

export class ReplyState {
  constructor({ messageId = null, conversationId = null, text = "", status = "streaming", offset = null } = {}) {
    this.messageId = messageId;
    this.conversationId = conversationId;
    this.userMessageId = null;
    this.text = text;
    this.offset = offset ?? cpLen(text); // code points received so far
    this.status = status; // streaming | a final status | "truncated" (page-only)
    this.finishReason = null;
    this.stoppedBy = null; // a cancelled reply's: "user", "admin" or "signed_out" (null: not known)
    this.usage = null;
    this.timings = null;
    this.error = null;
    this.gap = false; // the server skipped text we never got (should not happen)
    this.clientTtftMs = null;
    this.contextTokens = null; // the context the reply used (its prompt + text), of contextSize
    this.contextSize = null;
  }

  get done() {
    return this.status !== "streaming";
  }

  start(data) {
    if (data.message_id) this.messageId = String(data.message_id);
    if (data.conversation_id) this.conversationId = String(data.conversation_id);
    if (data.user_message_id) this.userMessageId = String(data.user_message_id);
    if (typeof data.offset === "number" && data.offset > this.offset) this.gap = true;
  }

  /** Apply a delta ending at offset `id`; returns the text actually appended ("" if all known). */
  delta(text, id) {
    if (typeof text !== "string" || text === "") return "";
    const len = cpLen(text);
    if (typeof id !== "number" || !Number.isFinite(id)) {
      this.text += text;
      this.offset += len;
      return text;
    }
    if (id <= this.offset) return ""; // all of it already shown
    const begin = id - len;
    let add = text;
    if (begin < this.offset) add = cpSkip(text, this.offset - begin);
    else if (begin > this.offset) this.gap = true;
    this.text += add;
    this.offset = id;
    return add;
  }

  /** A `final` or in-band `error` event. */
  finish(data, type = "final") {
    let status = data.status;
    if (type === "error" || !FINAL_STATUSES.has(status)) status = type === "error" ? "failed" : status || "failed";
    if (!FINAL_STATUSES.has(status)) status = "failed";
    this.status = status;
    this.finishReason = data.finish_reason ?? null;
    this.stoppedBy = status === "cancelled" ? (data.stopped_by ?? null) : null;
    this.usage = data.usage ?? this.usage;
    this.timings = data.timings ?? this.timings;
    this.contextTokens = data.context_tokens ?? this.contextTokens;
    this.contextSize = data.context_size ?? this.contextSize;
    this.error = data.error ?? (status === "failed" ? "The reply failed." : null);
  }

  /** The page gave up on the stream: shown as truncated, never as complete. */
  truncate(reason) {
    this.status = "truncated";
    this.error = reason || "The connection was lost before the reply finished.";
  }

  /** Build from a message row of GET /api/conversations/{id}. */
  static fromRow(row) {
    const s = new ReplyState({
      messageId: row.id != null ? String(row.id) : null,
      text: row.content || "",
      status: row.status || "completed",
    });
    s.finishReason = row.finish_reason ?? null;
    s.stoppedBy = row.stopped_by ?? null;
    if (row.prompt_tokens != null || row.completion_tokens != null) {
      s.usage = { prompt_tokens: row.prompt_tokens ?? null, completion_tokens: row.completion_tokens ?? null };
    }
    let total = null;
    if (row.created_at && row.finished_at) {
      const t = Date.parse(row.finished_at) - Date.parse(row.created_at);
      if (Number.isFinite(t) && t >= 0) total = t;
    }
    s.timings = { ttft_ms: row.ttft_ms ?? null, gap_p50_ms: row.gap_p50_ms ?? null, gap_p99_ms: row.gap_p99_ms ?? null, total_ms: total };
    s.error = row.error ?? null;
    s.clientTtftMs = row.client_ttft_ms ?? null;
    return s;
  }
}

/** Decode speed in tokens/s from usage and timings, or null. */
export function tokensPerSecond(usage, timings) {
  const n = usage?.completion_tokens;
  const total = timings?.total_ms;
  const ttft = timings?.ttft_ms;
  if (!n || total == null) return null;
  if (ttft != null && n > 1 && total > ttft) return ((n - 1) * 1000) / (total - ttft);
  return total > 0 ? (n * 1000) / total : null;
}
