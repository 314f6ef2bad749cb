// The incremental Markdown parse (static/js/markdown-stream.js) equals a full parse at every step.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseMarkdown } from "../../static/js/markdown.js";
import { MarkdownStream } from "../../static/js/markdown-stream.js";

/** Feed `src` to a MarkdownStream in steps of `step` characters; compare with a full parse each time. */
function checkEveryStep(src, step = 1) {
  const stream = new MarkdownStream();
  let mostFinished = 0;
  let previous = null;
  for (let i = 0; i <= src.length; i += step) {
    const text = src.slice(0, i);
    const { blocks, finished } = stream.update(text);
    assert.deepEqual(blocks, parseMarkdown(text).children, `after ${i} characters: ${JSON.stringify(text.slice(-40))}`);
    if (previous && finished > 0) {
      // Finished blocks are kept as they are (the page keeps their DOM).
      for (let k = 0; k < Math.min(finished, previous.finished); k++) assert.equal(blocks[k], previous.blocks[k]);
    }
    mostFinished = Math.max(mostFinished, finished);
    previous = { blocks, finished };
  }
  const whole = stream.update(src);
  assert.deepEqual(whole.blocks, parseMarkdown(src).children);
  return mostFinished;
}

// What the synthetic engine's [[synthetic:markdown]] replies look like (app/engine/synthetic/markdown.py).
const REPLY = `# façade a über ありがとう

Some words **bold** \`stream.token.reply.cache(batch=[step, engine, offset])\` more *words*.

1. token with and in \`offset_0\`
2. context naïve 한국어 «ok» \`delta_1\`
   - naïve smörgåsbord 한국어
     - «ok» naïve
3. שלום of עברית \`stream_2\`

| stream | reply | engine |
|:---|---:|:---:|
| \`reply\` | ✨ 東京 | reply with |
| \`stream\` | 🚀 to | Ærø and |

\`\`\`python
engine_0 = reply('engine', 0) < 0 && x
    offset_1 = delta('offset', 1) < 7 && x
\`\`\`

\`\`\`
<script>alert(1)</script>

still code after a blank line
\`\`\`

### heading three

- a
- b

- loose now

> quoted
lazy continuation

> another quote

plain paragraph
with a break and a https://example.com/link`;

// Cases where later text reaches back into earlier lines.
const TRICKY = [
  "foo\n#x\n\nbar",
  "foo\n***x and more\n\nbar",
  "foo\n---\n\nbar",
  "foo\n===\n\nnext",
  "- a\n\n  still a\n\n- b\n\nafter",
  "1. one\n\n3. three\n\n7) seven\n\ntext",
  "- a\n\n-\n\n* b\n\n**c**\n\n+ d",
  "1. one\n\n2\n\n10. ten\n\n11",
  "    indented code\n\n    more code\n\ntext\n\n    code again",
  "\`\`\`\nunclosed\n\nfence\n\n# not a heading",
  "~~~js\nx\n~~~\n\n\`\`\`\ny\n\`\`\`\n\nz",
  "| a | b |\n|---|---|\n| 1 | 2 |\n\n| c |\n|---|\n| 3 |\n\ntext",
  "[label] early\n\n[label]: https://example.com/a\n\nafter [label]",
  "text\n\n[x]: https://example.com/x\n\n[x] and [y]\n\n[y]: https://example.com/y\n\n[y]",
  "a\r\n\r\nb\r\n\r\n# c\r\n\r\n- d\r\n- e",
  "a\n\n\tb\n\n  \n\nc",
  "> q\n>\n> q2\n\nx\n\n> z",
  "<div>\n\n</div>\n\n<b>x</b>",
  "para\n\n   - deep\n\n     continued\n\nend",
];

test("incremental parse equals a full parse at every character of a reply", () => {
  const finished = checkEveryStep(REPLY);
  assert.ok(finished >= 8, `finished blocks: ${finished}`); // it does keep blocks
});

test("incremental parse equals a full parse in chunks of several characters", () => {
  for (const step of [3, 7, 40]) checkEveryStep(REPLY + "\n\n" + REPLY, step);
});

test("incremental parse equals a full parse where later text changes earlier lines", () => {
  for (const src of TRICKY) checkEveryStep(src);
});

test("a text that does not extend the previous one starts over", () => {
  const stream = new MarkdownStream();
  stream.update("# a\n\nb\n\nc");
  const { blocks } = stream.update("x\n\ny");
  assert.deepEqual(blocks, parseMarkdown("x\n\ny").children);
});

test("incremental parse equals a full parse on random mixes of Markdown lines", () => {
  const LINES = [
    "# h", "#", "#x", "para text", "- item", "-", "* star", "*", "**b**", "+ plus", "1. one", "2", "2.",
    "3) three", "  - nested", "    code", "   > q", "> quote", ">", "```", "```js", "~~~", "---", "***", "===",
    "| a | b |", "|---|---|", "| 1 | 2 |", "[r]: https://example.com/r", "[r]", "`inline`", "\t tab", " ",
    "<b>x</b>", "https://example.com/p", "text  ", "\\", "a | b",
  ];
  let seed = 12345;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  for (let doc = 0; doc < 60; doc++) {
    let src = "";
    for (let k = 0; k < 14; k++) src += LINES[rand(LINES.length)] + (rand(3) === 0 ? "\n\n" : "\n");
    checkEveryStep(src, 1 + rand(3));
  }
});
