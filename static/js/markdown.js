/**
 * Safe Markdown for model replies.
 *
 * Two steps, so the dangerous part is small and testable in node without a DOM:
 *   parseMarkdown(text) -> a plain tree: {tag, attrs?, children?} elements and {text} leaves, from
 *   markdown-it's tokens (vendor/markdown-it.js: CommonMark, GFM tables and ~~strikethrough~~,
 *   bare URLs; `html: false`, so HTML in the text stays text);
 *   nodeToDOM(node, document) -> DOM nodes, built ONLY with createElement / createTextNode /
 *   setAttribute, and only for the tags and attributes in the allowlists below (re-checked there,
 *   whatever the parser produced). This builder, not markdown-it, is the XSS boundary: model text
 *   only ever becomes text nodes. Links are kept only for absolute http(s) URLs (others keep their
 *   words) and open with rel="noopener noreferrer nofollow". Images are never loaded (rendered as
 *   links). Single newlines are line breaks, as in chat; an unclosed code fence runs to the end,
 *   which suits streaming.
 * Fenced code in a language highlight.js knows is highlighted (highlight.js: its token tree as
 * `span.hljs-*` nodes, never its HTML) once the block is closed: its closing fence has arrived, or
 * the reply has ended (`final`). A fence still growing stays plain text, so streaming stays cheap.
 */

import { highlightCode } from "./highlight.js";
import markdownit from "./vendor/markdown-it.js";

export const ALLOWED_TAGS = new Set([
  "p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "code", "em", "strong", "del", "a", "ul", "ol",
  "li", "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td", "span",
]);

/** A highlighted token's class; spans are built only inside <code> (see build). */
export const HIGHLIGHT_CLASS = /^hljs-[a-z]+(?:-[a-z]+)*$/;

const LINK_REL = "noopener noreferrer nofollow";
const LANG_RE = /^[A-Za-z0-9_+#.-]{1,32}$/;

/** The URL normalised by the URL parser if it is an absolute http(s) URL, else null. */
export function safeHref(raw) {
  if (typeof raw !== "string") return null;
  const url = raw.trim();
  // No whitespace or control characters anywhere (they hide "java\nscript:" style tricks).
  if (!url || /[\u0000-\u0020\u007f-\u009f]/.test(url)) return null;
  if (!/^https?:\/\//i.test(url)) return null;
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return null;
  return parsed.href;
}

function isAttrAllowed(tag, name, value) {
  if (typeof value !== "string") return false;
  switch (tag) {
    case "a":
      if (name === "href") return safeHref(value) === value;
      if (name === "rel") return value === LINK_REL;
      if (name === "target") return value === "_blank";
      return false;
    case "code":
      return name === "class" && /^language-[A-Za-z0-9_+#.-]{1,32}$/.test(value);
    case "ol":
      return name === "start" && /^[0-9]{1,9}$/.test(value);
    case "th":
    case "td":
      return name === "class" && /^align-(left|center|right)$/.test(value);
    case "span":
      return name === "class" && HIGHLIGHT_CLASS.test(value);
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Tree -> DOM

/** Build the DOM for one node of a tree from parseMarkdown (the allowlists above, re-checked). */
export function nodeToDOM(node, doc = globalThis.document) {
  return build(node, doc, false);
}

/** `inCode`: whether `node` sits inside a <code> (the only place a highlight span may be). */
function build(node, doc, inCode) {
  if (node == null) return null;
  if (typeof node.text === "string") return doc.createTextNode(node.text);
  if (!ALLOWED_TAGS.has(node.tag) || (node.tag === "span" && !inCode)) {
    // Never expected from our parser; degrade to the text inside, never to markup.
    return doc.createTextNode(plainText(node));
  }
  const el = doc.createElement(node.tag);
  if (node.attrs) {
    for (const [name, value] of Object.entries(node.attrs)) {
      if (isAttrAllowed(node.tag, name, value)) el.setAttribute(name, value);
    }
  }
  for (const child of node.children || []) {
    const c = build(child, doc, inCode || node.tag === "code");
    if (c) el.appendChild(c);
  }
  return el;
}

/** The text content of a tree (used for Copy and for degrading unknown nodes). */
export function plainText(node) {
  if (node == null) return "";
  if (typeof node.text === "string") return node.text;
  if (node.tag === "br") return "\n";
  return (node.children || []).map(plainText).join("");
}

/**
 * Parse and build in one go: what the page shows for `src` once the reply has ended (the page
 * builds the same blocks one by one, to keep those that did not change; the e2e tests compare the
 * page with this).
 */
export function renderMarkdown(src, doc = globalThis.document, { final = true } = {}) {
  const frag = doc.createDocumentFragment();
  for (const block of parseMarkdown(src, { final }).children) frag.appendChild(build(block, doc, false));
  return frag;
}

// ---------------------------------------------------------------------------------------------
// markdown-it tokens -> tree

const md = markdownit({ html: false, linkify: true, breaks: true });
// Every [text](url) becomes a link token; safeHref below decides, and an unsafe one keeps its words
// (markdown-it's own check would leave the whole "[text](javascript:...)" as literal text).
md.validateLink = () => true;
// Bare URLs only with their scheme: "main.py" or "a@b.io" stay text.
md.linkify.set({ fuzzyLink: false, fuzzyEmail: false });

/** Tags whose markdown-it token tag differs from ours (GFM strikethrough is <s> there). */
const TAG = { s: "del" };
const ALIGN = /^text-align:(left|center|right)$/;

/**
 * Parse Markdown source into a tree {tag: "root", children}. `final`: the text is complete (the
 * reply ended), so a fence without its closing line is closed too and gets highlighted.
 */
export function parseMarkdown(src, { final = false } = {}) {
  const root = { tag: "root", children: [] };
  appendTokens(md.parse(String(src ?? ""), {}), [root], final);
  return root;
}

/**
 * Parse `src` into its top-level blocks and the source line where each starts (markdown-stream.js
 * re-parses only the open end of a growing reply); `env.references` carries the reference
 * definitions ([label]: url) in and out. `lines` is null if the blocks cannot be placed.
 */
export function parseBlocks(src, env = {}) {
  const tokens = md.parse(String(src ?? ""), env);
  const root = { tag: "root", children: [] };
  appendTokens(tokens, [root]);
  const lines = tokens.filter((t) => t.level === 0 && t.nesting !== -1 && t.map).map((t) => t.map[0]);
  return { blocks: root.children, lines: lines.length === root.children.length ? lines : null };
}

function pushText(parent, text) {
  if (!text) return;
  const last = parent.children[parent.children.length - 1];
  if (last && typeof last.text === "string") last.text += text;
  else parent.children.push({ text });
}

function linkNode(href, children) {
  return { tag: "a", attrs: { href, rel: LINK_REL, target: "_blank" }, children };
}

/** The element a token opens (null: keep its content, drop the element). */
function openElement(token) {
  if (token.hidden) return null; // the paragraphs of a tight list item
  if (token.type === "link_open") {
    const href = safeHref(token.attrGet("href"));
    return href ? linkNode(href, []) : null;
  }
  const node = { tag: TAG[token.tag] || token.tag, children: [] };
  const start = token.attrGet("start"); // a number, set only when the list does not start at 1
  if (token.tag === "ol" && start != null) node.attrs = { start: String(start) };
  const align = ALIGN.exec(token.attrGet("style") || "");
  if (align) node.attrs = { class: `align-${align[1]}` };
  return node;
}

/**
 * Whether a fence token's closing line has arrived. markdown-it's fence rule maps the token to its
 * opening line, its content lines and, when found, the closing line (`token.map`, set from
 * `state.line = nextLine + (haveEndMarker ? 1 : 0)` in markdown-it's lib/rules_block/fence.mjs);
 * the content keeps one "\n" per line, the document's last line excepted.
 */
function fenceClosed(token) {
  const text = token.content;
  const contentLines = text === "" ? 0 : text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
  return token.map[1] - token.map[0] - 1 - contentLines === 1;
}

function codeBlock(token, final) {
  const source = token.content.replace(/\n$/, "");
  const code = { tag: "code", children: [{ text: source }] };
  const lang = (token.info || "").trim().split(/\s+/)[0];
  if (lang && LANG_RE.test(lang)) {
    code.attrs = { class: `language-${lang}` };
    const closed = token.type === "fence" && (final || fenceClosed(token));
    const highlighted = closed && source ? highlightCode(source, lang.toLowerCase()) : null;
    if (highlighted) code.children = highlighted;
  }
  return { tag: "pre", children: [code] };
}

/** Append markdown-it's flat token list (opening and closing tokens) to the tree as nodes. */
function appendTokens(tokens, stack, final) {
  for (const token of tokens) {
    const parent = stack[stack.length - 1];
    if (token.nesting === 1) {
      const node = openElement(token);
      if (node) parent.children.push(node);
      stack.push(node || parent);
      continue;
    }
    if (token.nesting === -1) {
      stack.pop();
      continue;
    }
    switch (token.type) {
      case "inline":
        appendTokens(token.children, stack, final);
        break;
      case "softbreak":
      case "hardbreak":
        parent.children.push({ tag: "br" });
        break;
      case "hr":
        parent.children.push({ tag: "hr" });
        break;
      case "code_inline":
        parent.children.push({ tag: "code", children: [{ text: token.content }] });
        break;
      case "fence":
      case "code_block":
        parent.children.push(codeBlock(token, final));
        break;
      case "image": {
        // Never loaded: a link to it, labelled with its alt text (or its URL).
        const label = { children: [] };
        appendTokens(token.children || [], [label]);
        const href = safeHref(token.attrGet("src"));
        if (href) parent.children.push(linkNode(href, label.children.length ? label.children : [{ text: href }]));
        else parent.children.push(...label.children);
        break;
      }
      default: // text, and anything else markdown-it may emit: its text, as text
        pushText(parent, token.content);
    }
  }
}
