/**
 * Markdown for a reply that grows at its end: the parse of the whole text, made by re-parsing only
 * its open end. Top-level blocks that can no longer change are kept ("finished"), so a long reply
 * costs each render the parse of its last blocks, not of all of it (issue 11, item 7).
 *
 * When is a block finished? Text only ever grows at the end, and a top-level block that starts
 * after a blank line begins from a clean slate: nothing before it is still open (an unclosed fence
 * or an indented code block would have swallowed the line; a list or a blockquote continued past
 * the blank line would have made it part of them). So every block before the LAST block that
 * starts after a blank line is finished: its source lines are complete and no later text can reach
 * back into them, once that block's first line is complete (its kind is then settled: "3" could
 * still become "3.", an item of the list above). Blocks that follow without a blank line stay
 * open: "foo\n#" is a paragraph and an empty heading, but "foo\n#x" is one paragraph.
 * Reference definitions ([label]: url) are the one thing later text can change earlier blocks
 * with ("[label]" before the definition becomes a link): so no block is finished while the text
 * has one, and one that appears in the open end makes everything parse again from the top (rare
 * in replies; such a reply just costs a whole parse per render, as before).
 *
 * The invariant (tests/js/markdown-stream.test.mjs checks it at every character of a corpus):
 * `update(text).blocks` equals `parseMarkdown(text).children`.
 */

import { parseBlocks } from "./markdown.js";

const NEWLINE = /\r\n|\r|\n/g; // markdown-it's own normalisation (its "normalize" core rule)
const BLANK = /^[ \t]*$/;

/** The offset where each line of `src` starts. */
function lineStarts(src) {
  const starts = [0];
  for (const m of src.matchAll(NEWLINE)) starts.push(m.index + m[0].length);
  return starts;
}

export class MarkdownStream {
  constructor() {
    this.reset();
  }

  reset() {
    this.src = "";
    this.finishedAt = 0; // offset in src where the open end begins
    this.finished = []; // the finished blocks' trees
  }

  /**
   * The blocks of `src`: {blocks, finished} where blocks[0, finished) are the same objects as in
   * the previous call (their DOM may be kept) and the rest were parsed again.
   * A text that does not extend the previous one starts over.
   */
  update(src) {
    src = String(src ?? "");
    if (!src.startsWith(this.src)) this.reset();
    this.src = src;
    const open = src.slice(this.finishedAt);
    const env = {};
    let { blocks, lines } = parseBlocks(open, env);
    const hasReferences = env.references && Object.keys(env.references).length > 0;
    if (hasReferences && this.finishedAt > 0) {
      this.reset();
      return this.update(src);
    }
    if (lines && !hasReferences) {
      const cut = this.lastCleanStart(open, lines);
      if (cut) {
        this.finished.push(...blocks.slice(0, cut.index));
        this.finishedAt += cut.offset;
        blocks = blocks.slice(cut.index);
      }
    }
    return { blocks: this.finished.concat(blocks), finished: this.finished.length };
  }

  /**
   * The last block (not the first) that starts right after a blank line, on a line that is
   * complete: {index, offset}, or null.
   */
  lastCleanStart(open, lines) {
    const starts = lineStarts(open);
    for (let j = lines.length - 1; j > 0; j--) {
      const line = lines[j];
      const lineDone = line + 1 < starts.length; // "3" may yet become "3.", an item of the list above
      if (lineDone && line > 0 && BLANK.test(open.slice(starts[line - 1], starts[line]).replace(NEWLINE, ""))) {
        return { index: j, offset: starts[line] };
      }
    }
    return null;
  }
}
