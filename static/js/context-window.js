/**
 * What the model sees of the conversation on screen (issue 22), as pure functions: where the
 * "outside the model's memory" divider goes, what the context meter shows, and the composer's
 * estimate of a message's tokens. The page's components (context-view.js) draw them.
 *
 * The server fits each reply's prompt to the model's context and stores where its window began
 * (`window_start_id`: the first message its prompt held; null: from the start). The divider sits
 * above that message for the latest reply of the branch shown.
 *
 * The estimate is a LOWER BOUND, on purpose: the composer must never refuse a message the server
 * would take. A byte-level BPE tokenizer (SmolLM2's, like GPT-2's, Llama 3's or Qwen's) first
 * splits text into pieces that no token crosses: runs of letters, of digits, of symbols, of
 * whitespace. So the estimate counts one token per run of letters (one per 16 bytes of a longer
 * one), per 3 digits (SmolLM2 takes one digit per token), per run of symbols (a single symbol
 * right before a word may share its token: Llama 3's pieces), per emoji, per run of whitespace
 * holding a line break or several spaces; ideographs and other scripts written without spaces
 * (Chinese, Japanese, Korean, Thai...) one per 2 characters (SmolLM2 spends 1 to 3 on each); and
 * the 4 tokens a chat template's framing of one message takes at least (ChatML's
 * `<|im_start|>user\n ... <|im_end|>\n` is 5; the server's counts include it). English prose
 * comes out about 5 to 10% under SmolLM2's real count, code and other scripts further
 * under. A message the estimate passes may still be refused by the server: its 400 names the
 * limit, and the composer shows it.
 */

export const FRAMING_TOKENS = 4;

const CLOSE = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}\p{Script=Thai}\p{Script=Lao}\p{Script=Khmer}\p{Script=Myanmar}]/u;
const PIECES = /([\p{L}\p{M}]+)|(\p{N}+)|(\s+)|([^\s\p{L}\p{M}\p{N}]+)/gu;
const EMOJI = /\p{Extended_Pictographic}/gu;
const utf8 = new TextEncoder();

function letterTokens(run) {
  let close = 0;
  let other = "";
  for (const ch of run) {
    if (CLOSE.test(ch)) close++;
    else other += ch;
  }
  return Math.ceil(close / 2) + (other ? Math.ceil(utf8.encode(other).length / 16) : 0);
}

/** At least how many tokens `text` takes as one chat message (see the module's comment). */
export function estimateTokens(text) {
  const s = String(text ?? "");
  let n = 0;
  for (const m of s.matchAll(PIECES)) {
    const [piece, letters, digits, space] = m;
    if (letters) n += letterTokens(letters);
    else if (digits) n += Math.ceil(digits.length / 3);
    else if (space) n += /[\r\n]/.test(space) || space.length > 1 ? 1 : 0;
    else {
      const emoji = piece.match(EMOJI)?.length || 0;
      const beforeWord = [...piece].length === 1 && /^[\p{L}\p{M}]/u.test(s.slice(m.index + piece.length));
      n += Math.max(emoji, beforeWord ? 0 : 1);
    }
  }
  return n + FRAMING_TOKENS;
}

/** The composer's verdict on a draft: `{over, tokens, limit}`; `over` only when even the lower
 * bound passes the limit (no limit known: never over). */
export function messageFits(text, maxMessageTokens) {
  const tokens = estimateTokens(text);
  const limit = Number.isFinite(maxMessageTokens) ? maxMessageTokens : null;
  return { over: limit != null && tokens > limit, tokens, limit };
}

/** The latest reply of these rows (the branch shown, oldest first), or null. */
export function latestReply(rows) {
  for (let i = rows.length - 1; i >= 0; i--) if (rows[i]?.role === "assistant") return rows[i];
  return null;
}

/**
 * The id of the message the divider goes above: the latest reply's window start, when that
 * message is among `drawnIds` (the ids drawn on the page, oldest first) and is not the first
 * message of the whole branch (`earlierNotDrawn`: how many of the branch's messages come before
 * the drawn ones). Null: no divider in the drawn part (the window holds everything drawn, or its
 * start has not been drawn yet: scrolling up draws it, and the divider then).
 */
export function dividerBefore(windowStartId, drawnIds, earlierNotDrawn = 0) {
  if (windowStartId == null) return null;
  const at = drawnIds.indexOf(String(windowStartId));
  if (at === -1) return null;
  if (at === 0 && !earlierNotDrawn) return null; // nothing before it: the whole conversation
  return String(windowStartId);
}

const numbers = new Intl.NumberFormat("en-US");

/** What the meter shows: tokens used of the context, or null when nothing is known. */
export function meterReading(used, size) {
  if (!Number.isFinite(size) || size <= 0) return null;
  const tokens = Math.max(0, Number.isFinite(used) ? used : 0);
  const shown = Math.min(tokens, size);
  const percent = Math.round((100 * shown) / size);
  return {
    value: shown,
    max: size,
    percent,
    text: `${numbers.format(tokens)} / ${numbers.format(size)} tokens`,
    spoken: `${numbers.format(tokens)} of ${numbers.format(size)} tokens (${percent}%)`,
  };
}

/** The tokens the latest reply of `rows` used (its prompt and its text), as stored; or null. */
export function storedUse(rows) {
  const reply = latestReply(rows);
  if (!reply || reply.prompt_tokens == null) return null;
  return reply.prompt_tokens + (reply.completion_tokens ?? 0);
}
