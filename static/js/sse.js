/**
 * A small, spec-following Server-Sent Events parser (WHATWG HTML, "Event stream interpretation").
 *
 * - Lines end with "\r\n", "\n" or "\r" — including a "\r" at the end of one chunk whose "\n"
 *   arrives at the start of the next.
 * - "data:" lines accumulate, joined with "\n"; "event:" names the event; "id:" sets the last event
 *   id (which persists across events, as in the spec); "retry:" is parsed; ":" lines are comments.
 * - An event is dispatched on a blank line. An event that the stream ends in the middle of is
 *   discarded (never half-delivered): a caller sees only complete events.
 * - `readSSE` decodes bytes with TextDecoder in stream mode, so a UTF-8 character split across
 *   two network chunks is decoded correctly.
 *
 * Pure module: no DOM, usable in node for tests.
 */

const LINE_BREAK = /[\r\n]/g;

export class SSEParser {
  constructor() {
    this.lastEventId = "";
    this.retry = null;
    this._buf = "";
    this._skipLF = false; // the previous chunk ended with "\r": a leading "\n" belongs to it
    this._data = [];
    this._hasData = false;
    this._event = "";
    this._sawId = false;
    this._first = true;
    this.comments = 0;
  }

  /**
   * Feed decoded text; returns the events completed by it, in order.
   * Each event: {event, data, id, hasId} — `id` is the last event id (a string, "" if none yet),
   * `hasId` says whether this event's own block carried an "id:" field.
   */
  feed(text) {
    const out = [];
    if (!text) return out;
    if (this._first) {
      this._first = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this._skipLF) {
      this._skipLF = false;
      if (text[0] === "\n") text = text.slice(1);
    }
    const s = this._buf + text;
    let pos = 0;
    LINE_BREAK.lastIndex = 0;
    for (;;) {
      const m = LINE_BREAK.exec(s);
      if (m === null) break;
      const end = m.index;
      const line = s.slice(pos, end);
      if (s[end] === "\r") {
        if (end + 1 < s.length) {
          pos = end + (s[end + 1] === "\n" ? 2 : 1);
        } else {
          pos = end + 1;
          this._skipLF = true;
        }
      } else {
        pos = end + 1;
      }
      LINE_BREAK.lastIndex = pos;
      this._line(line, out);
    }
    this._buf = s.slice(pos);
    return out;
  }

  /** The stream ended: an unterminated event is discarded, per the spec. */
  end() {
    this._buf = "";
    this._data = [];
    this._hasData = false;
    this._event = "";
    this._sawId = false;
    return [];
  }

  _line(line, out) {
    if (line === "") {
      this._dispatch(out);
      return;
    }
    if (line[0] === ":") {
      this.comments += 1;
      return;
    }
    const colon = line.indexOf(":");
    let field;
    let value;
    if (colon === -1) {
      field = line;
      value = "";
    } else {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value[0] === " ") value = value.slice(1);
    }
    switch (field) {
      case "event":
        this._event = value;
        break;
      case "data":
        this._data.push(value);
        this._hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) {
          this.lastEventId = value;
          this._sawId = true;
        }
        break;
      case "retry":
        if (/^[0-9]+$/.test(value)) this.retry = Number(value);
        break;
      default:
        break; // unknown fields are ignored
    }
  }

  _dispatch(out) {
    const hasId = this._sawId;
    this._sawId = false;
    if (!this._hasData) {
      this._event = "";
      return;
    }
    out.push({
      event: this._event || "message",
      data: this._data.join("\n"),
      id: this.lastEventId,
      hasId,
    });
    this._data = [];
    this._hasData = false;
    this._event = "";
  }
}

/**
 * Read a byte stream (a fetch Response body) as SSE events.
 * `onChunk` is called for every chunk received (keepalive comments included): a liveness signal.
 * Ends normally when the body ends; an incomplete trailing event is dropped.
 */
export async function* readSSE(body, { onChunk } = {}) {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  const parser = new SSEParser();
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (onChunk) onChunk();
      const text = decoder.decode(value, { stream: true });
      for (const ev of parser.feed(text)) yield ev;
    }
    finished = true;
    for (const ev of parser.feed(decoder.decode())) yield ev;
    parser.end();
  } finally {
    if (!finished) {
      // The consumer stopped early (or the read failed): let go of the connection.
      reader.cancel().catch(() => {});
    }
  }
}
