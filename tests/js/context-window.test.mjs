// Unit tests for what the page shows of the model's window (issue 22): node --test tests/js/
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  dividerBefore,
  estimateTokens,
  latestReply,
  messageFits,
  meterReading,
  storedUse,
} from "../../static/js/context-window.js";

// Texts and their tokens as one chat message, by SmolLM2-135M-Instruct's own tokenizer with its
// ChatML framing (`<|im_start|>user\n…<|im_end|>\n`), as the server counts a message.
const SMOLLM2 = [
  ["Hello, how are you today?", 12],
  ["word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word ", 56],
  ["Tell me a long story about dragons and the sea, with castles and owls.", 21],
  ["The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. ", 56],
  ["def f(x):\n    return x ** 2 + 3.14159 * x  # comment\n\nprint(f(12345678))", 45],
  ["Phone: 555-123-4567, year 2026, pi 3.14159265358979", 46],
  ["日本語のテキストです。東京は大きな都市です。", 43],
  ["这是一个中文句子，用于测试分词器。", 28],
  ["Ünïcödé façade naïve café résumé", 21],
  ["https://example.com/path/to/resource?query=1&other=two#frag", 26],
  ["!!!??? ... --- *** ``` ~~~", 15],
  ["Antidisestablishmentarianism supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis", 35],
  ["مرحبا كيف حالك اليوم؟ هذا نص عربي", 37],
  ["🙂🙃 emoji 🎉🎉🎉 party", 22],
  ["    indented\n\n\n\ttabs\t\tand   spaces   ", 17],
  ["a", 6],
  ["", 5],
];

test("the estimate never passes SmolLM2's real count: the composer refuses nothing that fits", () => {
  for (const [text, real] of SMOLLM2) assert.ok(estimateTokens(text) <= real, `${estimateTokens(text)} > ${real}: ${text}`);
});

test("for English prose the estimate is close (within 15%), so a long message is caught early", () => {
  const prose = SMOLLM2.filter(([t]) => /^(Hello|word|Tell|The quick)/.test(t));
  assert.equal(prose.length, 4);
  for (const [text, real] of prose) assert.ok(estimateTokens(text) >= real * 0.85, `${estimateTokens(text)} vs ${real}: ${text}`);
});

test("the estimate counts words, digit groups, symbols, line breaks, close scripts and the framing", () => {
  assert.equal(estimateTokens(""), 4); // the framing alone
  assert.equal(estimateTokens("one two three"), 4 + 3);
  assert.equal(estimateTokens("1234567"), 4 + 3); // 3 digits a piece at most
  assert.equal(estimateTokens("a, b"), 4 + 3); // the comma is a piece of its own
  assert.equal(estimateTokens("(x"), 4 + 1); // a single symbol may share the word's token
  assert.equal(estimateTokens("one\n\ntwo"), 4 + 3);
  assert.equal(estimateTokens("東京都"), 4 + 2); // one per 2 ideographs
  assert.equal(estimateTokens("x".repeat(40)), 4 + 3); // one per 16 bytes of a long run
  assert.equal(estimateTokens("🎉🎉🎉"), 4 + 3);
  // grows with the text: a 10x longer message is estimated about 10x longer
  const one = estimateTokens("The quick brown fox jumps over the lazy dog. ");
  const ten = estimateTokens("The quick brown fox jumps over the lazy dog. ".repeat(10));
  assert.equal(ten - 4, 10 * (one - 4));
});

test("a draft is over only past a known limit", () => {
  const long = "word ".repeat(100);
  assert.deepEqual(messageFits(long, 50), { over: true, tokens: 104, limit: 50 });
  assert.equal(messageFits(long, 104).over, false);
  assert.equal(messageFits(long, undefined).over, false); // no limit known (engine not running)
  assert.equal(messageFits(long, null).over, false);
});

const rows = [
  { id: "q1", role: "user" },
  { id: "r1", role: "assistant", window_start_id: null, prompt_tokens: 20, completion_tokens: 5 },
  { id: "q2", role: "user" },
  { id: "r2", role: "assistant", window_start_id: "q2", prompt_tokens: 30, completion_tokens: 12 },
  { id: "q3", role: "user" },
];

test("the latest reply of the branch shown, and the context it used as stored", () => {
  assert.equal(latestReply(rows).id, "r2");
  assert.equal(latestReply([]), null);
  assert.equal(storedUse(rows), 42);
  assert.equal(storedUse(rows.slice(0, 1)), null);
  assert.equal(storedUse([{ role: "assistant", prompt_tokens: null }]), null); // not finished
});

test("the divider goes above the window's first message when it is drawn", () => {
  const drawn = ["q1", "r1", "q2", "r2", "q3"];
  assert.equal(dividerBefore("q2", drawn, 0), "q2");
  assert.equal(dividerBefore(null, drawn, 0), null); // the model saw the whole conversation
  assert.equal(dividerBefore("q3", drawn, 0), "q3"); // only the question fitted
});

test("no divider while the window's first message is among those not drawn yet", () => {
  // Drawn: the newest 3 of a long branch; the window starts 200 messages up: everything drawn is
  // inside it, and the divider comes when scrolling up draws its first message.
  assert.equal(dividerBefore("old-q", ["q2", "r2", "q3"], 200), null);
  assert.equal(dividerBefore("old-q", ["old-q", "old-r", "q2", "r2", "q3"], 190), "old-q");
});

test("no divider above the very first message (nothing is outside); above the first drawn one when older are not drawn", () => {
  assert.equal(dividerBefore("q1", ["q1", "r1"], 0), null);
  assert.equal(dividerBefore("q1", ["q1", "r1"], 30), "q1");
});

test("the meter reads tokens used of the context, grouped, with a spoken form", () => {
  assert.deepEqual(meterReading(1234, 8192), {
    value: 1234,
    max: 8192,
    percent: 15,
    text: "1,234 / 8,192 tokens",
    spoken: "1,234 of 8,192 tokens (15%)",
  });
  assert.equal(meterReading(10, null), null); // no context known: no meter
  assert.equal(meterReading(9000, 8192).value, 8192); // the bar stops at full
  assert.equal(meterReading(9000, 8192).text, "9,000 / 8,192 tokens");
  assert.equal(meterReading(null, 512).text, "0 / 512 tokens");
});
