/**
 * A small, safe Markdown renderer for model replies.
 *
 * Two steps, so the dangerous part is tiny and testable in node without a DOM:
 *   parseMarkdown(text) -> a plain tree: {tag, attrs?, children?} elements and {text} leaves;
 *   toDOM(tree, document) -> DOM nodes, built ONLY with createElement / createTextNode /
 *   setAttribute, and only for the tags and attributes in the allowlists below (re-checked there,
 *   whatever the parser produced). Model text only ever becomes text nodes, so nothing in it can
 *   inject markup or script. Links are kept only for absolute http(s) URLs and open with
 *   rel="noopener noreferrer nofollow". Images are never loaded (rendered as links).
 *
 * Supported: paragraphs (single newlines are line breaks, as in chat), ATX headings, fenced code
 * blocks (``` or ~~~, with a language; an unclosed fence runs to the end, which suits streaming),
 * block quotes, bullet and ordered lists (nested by indentation), GFM tables, horizontal rules,
 * inline code, **strong**, *em*, ~~del~~, [links](https://...), <https://autolinks> and bare URLs.
 */

export const ALLOWED_TAGS = new Set([
  "p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "code", "em", "strong", "del", "a", "ul", "ol",
  "li", "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td",
]);

const LINK_REL = "noopener noreferrer nofollow";
const LANG_RE = /^[A-Za-z0-9_+#.-]{1,32}$/;
const MAX_DEPTH = 8;
const MAX_INLINE = 200_000; // longer paragraphs are shown as plain text (no inline parsing)

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
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Tree -> DOM

/** Build DOM nodes for a tree from parseMarkdown. Returns a DocumentFragment. */
export function toDOM(tree, doc = globalThis.document) {
  const frag = doc.createDocumentFragment();
  for (const child of tree.children || []) {
    const node = build(child, doc);
    if (node) frag.appendChild(node);
  }
  return frag;
}

/** Build the DOM for one node of the tree (the same allowlists as toDOM). */
export function nodeToDOM(node, doc = globalThis.document) {
  return build(node, doc);
}

function build(node, doc) {
  if (node == null) return null;
  if (typeof node.text === "string") return doc.createTextNode(node.text);
  if (!ALLOWED_TAGS.has(node.tag)) {
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
    const c = build(child, doc);
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

/** Parse and build in one go. */
export function renderMarkdown(src, doc = globalThis.document) {
  return toDOM(parseMarkdown(src), doc);
}

// ---------------------------------------------------------------------------------------------
// Blocks

const FENCE_OPEN = /^( {0,3})(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?/;
const LIST_ITEM = /^( {0,3})([-*+]|[0-9]{1,9}[.)])(?:([ \t]+)(.*)|[ \t]*$)/;
const TABLE_DELIM = /^[ \t]*\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;

const isBlank = (line) => /^[ \t]*$/.test(line);

/** Parse Markdown source into a tree {tag: "root", children}. */
export function parseMarkdown(src) {
  const text = String(src ?? "").replace(/\r\n?/g, "\n").replace(/\u0000/g, "\ufffd");
  return { tag: "root", children: parseBlocks(text.split("\n"), 0) };
}

function fenceOpen(line) {
  const m = FENCE_OPEN.exec(line);
  if (!m) return null;
  const info = m[3].trim();
  if (m[2][0] === "`" && info.includes("`")) return null;
  const lang = info.split(/\s+/)[0] || "";
  return { indent: m[1].length, char: m[2][0], len: m[2].length, lang: LANG_RE.test(lang) ? lang : "" };
}

function isFenceClose(line, open) {
  const m = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(line);
  return !!m && m[1][0] === open.char && m[1].length >= open.len;
}

function listMarker(line) {
  const m = LIST_ITEM.exec(line);
  if (!m) return null;
  const marker = m[2];
  const ordered = /[0-9]/.test(marker[0]);
  const spaces = m[3] ? m[3].replace(/\t/g, "    ").length : 1;
  const width = m[1].length + marker.length + (spaces > 4 ? 1 : spaces);
  return {
    ordered,
    // bullets of a different character, or a different delimiter, start a new list
    kind: ordered ? marker.slice(-1) : marker,
    start: ordered ? parseInt(marker, 10) : 1,
    width,
    first: m[4] !== undefined ? (spaces > 4 ? " ".repeat(spaces - 1) + m[4] : m[4]) : "",
    empty: m[4] === undefined || isBlank(m[4]),
  };
}

function isTableStart(lines, i) {
  return (
    i + 1 < lines.length &&
    lines[i].includes("|") &&
    TABLE_DELIM.test(lines[i + 1]) &&
    lines[i + 1].includes("-") &&
    splitRow(lines[i]).length === splitRow(lines[i + 1]).length
  );
}

/** Can this line interrupt a paragraph? */
function startsBlock(lines, i) {
  const line = lines[i];
  if (fenceOpen(line) || HEADING.test(line) || HR.test(line) || QUOTE.test(line)) return true;
  const li = listMarker(line);
  if (li && !li.empty && (!li.ordered || li.start === 1)) return true;
  return isTableStart(lines, i);
}

function dedent(line, n) {
  let i = 0;
  while (i < n && i < line.length && line[i] === " ") i++;
  return line.slice(i);
}

function indentOf(line) {
  const m = /^[ ]*/.exec(line.replace(/\t/g, "    "));
  return m[0].length;
}

function parseBlocks(lines, depth) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      i++;
      continue;
    }

    const fence = fenceOpen(line);
    if (fence) {
      const body = [];
      i++;
      while (i < lines.length && !isFenceClose(lines[i], fence)) {
        body.push(dedent(lines[i], fence.indent));
        i++;
      }
      i++; // the closing fence (or past the end: an unclosed fence runs to the end)
      const code = { tag: "code", children: [{ text: body.join("\n") }] };
      if (fence.lang) code.attrs = { class: `language-${fence.lang}` };
      out.push({ tag: "pre", children: [code] });
      continue;
    }

    const h = HEADING.exec(line);
    if (h) {
      out.push({ tag: `h${h[1].length}`, children: parseInline((h[2] || "").trim(), depth) });
      i++;
      continue;
    }

    if (HR.test(line)) {
      out.push({ tag: "hr" });
      i++;
      continue;
    }

    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length) {
        if (QUOTE.test(lines[i])) body.push(lines[i].replace(QUOTE, ""));
        else if (!isBlank(lines[i]) && !startsBlock(lines, i) && body.length && !isBlank(body[body.length - 1]))
          body.push(lines[i]); // lazy continuation of a quoted paragraph
        else break;
        i++;
      }
      const children =
        depth < MAX_DEPTH ? parseBlocks(body, depth + 1) : [{ tag: "p", children: [{ text: body.join("\n") }] }];
      out.push({ tag: "blockquote", children });
      continue;
    }

    if (isTableStart(lines, i)) {
      const [table, next] = parseTable(lines, i, depth);
      out.push(table);
      i = next;
      continue;
    }

    const li = listMarker(line);
    if (li) {
      const [list, next] = parseList(lines, i, li, depth);
      out.push(list);
      i = next;
      continue;
    }

    // Paragraph
    const para = [line.replace(/^[ \t]+/, "")];
    i++;
    while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines, i)) {
      para.push(lines[i].replace(/^[ \t]+/, ""));
      i++;
    }
    out.push({ tag: "p", children: parseInline(para.join("\n").replace(/[ \t]+$/, ""), depth) });
  }
  return out;
}

function parseList(lines, i, first, depth) {
  const items = [];
  let loose = false;
  let marker = first;
  while (marker) {
    const body = [marker.first];
    const width = marker.width;
    i++;
    let sawBlank = false;
    while (i < lines.length) {
      const line = lines[i];
      if (isBlank(line)) {
        sawBlank = true;
        body.push("");
        i++;
        continue;
      }
      if (indentOf(line) >= width) {
        if (sawBlank) loose = true;
        body.push(dedent(line.replace(/^\t/, "    "), width));
        sawBlank = false;
        i++;
        continue;
      }
      // Not indented enough: lazy paragraph continuation, or the end of this item.
      if (!sawBlank && !startsBlock(lines, i) && !listMarker(line)) {
        body.push(line.replace(/^[ \t]+/, ""));
        i++;
        continue;
      }
      break;
    }
    while (body.length && isBlank(body[body.length - 1])) body.pop();
    const children = depth < MAX_DEPTH ? parseBlocks(body, depth + 1) : [{ tag: "p", children: [{ text: body.join("\n") }] }];
    items.push(children);

    const next = i < lines.length ? listMarker(lines[i]) : null;
    if (next && next.ordered === first.ordered && next.kind === first.kind) {
      if (sawBlank) loose = true;
      marker = next;
    } else {
      marker = null;
    }
  }
  const list = {
    tag: first.ordered ? "ol" : "ul",
    children: items.map((children) => ({
      tag: "li",
      // A tight list shows its paragraphs inline.
      children: loose ? children : children.flatMap((c) => (c.tag === "p" ? c.children : [c])),
    })),
  };
  if (first.ordered && first.start !== 1) list.attrs = { start: String(first.start) };
  return [list, i];
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  const cells = [];
  let cur = "";
  for (let k = 0; k < s.length; k++) {
    if (s[k] === "\\" && s[k + 1] === "|") {
      cur += "|";
      k++;
    } else if (s[k] === "|") {
      cells.push(cur.trim());
      cur = "";
    } else {
      cur += s[k];
    }
  }
  cells.push(cur.trim());
  return cells;
}

function parseTable(lines, i, depth) {
  const header = splitRow(lines[i]);
  const aligns = splitRow(lines[i + 1]).map((d) => {
    const l = d.startsWith(":");
    const r = d.endsWith(":");
    return l && r ? "center" : r ? "right" : l ? "left" : null;
  });
  const cell = (tag, content, k) => {
    const node = { tag, children: parseInline(content, depth) };
    if (aligns[k]) node.attrs = { class: `align-${aligns[k]}` };
    return node;
  };
  const thead = { tag: "thead", children: [{ tag: "tr", children: header.map((c, k) => cell("th", c, k)) }] };
  const rows = [];
  i += 2;
  while (i < lines.length && !isBlank(lines[i]) && lines[i].includes("|")) {
    const cells = splitRow(lines[i]);
    rows.push({
      tag: "tr",
      children: header.map((_, k) => cell("td", cells[k] ?? "", k)),
    });
    i++;
  }
  const table = { tag: "table", children: [thead] };
  if (rows.length) table.children.push({ tag: "tbody", children: rows });
  return [table, i];
}

// ---------------------------------------------------------------------------------------------
// Inlines

const ESCAPABLE = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const BARE_URL = /^https?:\/\/[^\s<>"'`]+/i;
const isSpace = (c) => c === undefined || /\s/.test(c);
const isAlnum = (c) => c !== undefined && /[\p{L}\p{N}]/u.test(c);

function linkNode(href, children) {
  return { tag: "a", attrs: { href, rel: LINK_REL, target: "_blank" }, children };
}

/** Parse inline Markdown; returns a list of nodes. `noLinks` inside link text. */
export function parseInline(s, depth = 0, noLinks = false) {
  if (depth > MAX_DEPTH || s.length > MAX_INLINE) return s ? [{ text: s }] : [];
  const out = [];
  let buf = "";
  const flush = () => {
    if (buf) out.push({ text: buf });
    buf = "";
  };
  // For each delimiter kind, the smallest position from which no closer exists: searches
  // starting there or later fail without scanning again (keeps pathological input linear-ish).
  const noCloserFrom = Object.create(null);

  const findCloser = (kind, from, valid) => {
    if (noCloserFrom[kind] !== undefined && from >= noCloserFrom[kind]) return -1;
    let j = s.indexOf(kind[0], from);
    while (j !== -1) {
      if (valid(j)) return j;
      j = s.indexOf(kind[0], j + 1);
    }
    noCloserFrom[kind] = Math.min(noCloserFrom[kind] ?? Infinity, from);
    return -1;
  };

  const runAt = (j, c) => {
    let k = j;
    while (s[k] === c) k++;
    return k - j;
  };

  let brackets = null; // computed on the first "["

  let i = 0;
  while (i < s.length) {
    const c = s[i];

    if (c === "\\") {
      const n = s[i + 1];
      if (n === "\n") {
        flush();
        out.push({ tag: "br" });
        i += 2;
        continue;
      }
      if (n !== undefined && ESCAPABLE.includes(n)) {
        buf += n;
        i += 2;
        continue;
      }
    }

    if (c === "\n") {
      buf = buf.replace(/[ \t]+$/, "");
      flush();
      out.push({ tag: "br" });
      i++;
      while (s[i] === " " || s[i] === "\t") i++;
      continue;
    }

    if (c === "`") {
      const n = runAt(i, "`");
      const close = findCloser("`".repeat(n), i + n, (j) => runAt(j, "`") === n && s[j - 1] !== "`");
      if (close !== -1) {
        let code = s.slice(i + n, close).replace(/\n/g, " ");
        if (code.length > 2 && code[0] === " " && code[code.length - 1] === " " && code.trim()) code = code.slice(1, -1);
        flush();
        out.push({ tag: "code", children: [{ text: code }] });
        i = close + n;
        continue;
      }
      buf += s.slice(i, i + n);
      i += n;
      continue;
    }

    if (c === "*" || c === "_" || c === "~") {
      const n = runAt(i, c);
      const opensOk =
        !isSpace(s[i + n]) && (c !== "_" || !isAlnum(s[i - 1]));
      const closeValid = (len) => (j) =>
        runAt(j, c) === len &&
        s[j - 1] !== c &&
        !isSpace(s[j - 1]) &&
        (c !== "_" || !isAlnum(s[j + len]));
      let done = false;
      if (opensOk) {
        const tries =
          c === "~"
            ? n >= 2 ? [[2, "del"]] : []
            : n >= 3 ? [[3, "strong+em"], [2, "strong"], [1, "em"]]
            : n === 2 ? [[2, "strong"], [1, "em"]]
            : [[1, "em"]];
        for (const [len, what] of tries) {
          const close = findCloser(c.repeat(len) + ":" + len, i + len + 1, closeValid(len));
          if (close === -1) continue;
          const inner = parseInline(s.slice(i + len, close), depth + 1, noLinks);
          flush();
          if (len < n) buf += c.repeat(n - len); // extra opening delimiters stay literal
          if (what === "strong+em") out.push({ tag: "strong", children: [{ tag: "em", children: inner }] });
          else out.push({ tag: what, children: inner });
          i = close + len;
          done = true;
          break;
        }
      }
      if (done) continue;
      buf += s.slice(i, i + n);
      i += n;
      continue;
    }

    if (!noLinks && (c === "[" || (c === "!" && s[i + 1] === "["))) {
      const start = c === "!" ? i + 1 : i;
      if (!brackets) brackets = matchBrackets(s);
      const link = parseLink(s, start, brackets);
      if (link) {
        flush();
        const label = parseInline(link.label, depth + 1, true);
        const href = safeHref(link.dest);
        if (href) out.push(linkNode(href, label.length ? label : [{ text: href }]));
        else out.push(...label); // unsafe or relative URL: keep the words, drop the link
        i = link.end;
        continue;
      }
    }

    if (!noLinks && c === "<") {
      const m = /^<(https?:\/\/[^\s<>]+)>/i.exec(s.slice(i, i + 2048));
      const href = m && safeHref(m[1]);
      if (href) {
        flush();
        out.push(linkNode(href, [{ text: m[1] }]));
        i += m[0].length;
        continue;
      }
    }

    if (!noLinks && (c === "h" || c === "H") && !isAlnum(s[i - 1])) {
      const m = BARE_URL.exec(s.slice(i, i + 2048));
      if (m) {
        let url = m[0].replace(/[.,;:!?*_~]+$/, "");
        // Drop a trailing ")" that closes a parenthesis opened before the URL.
        while (url.endsWith(")") && (url.match(/\(/g) || []).length < (url.match(/\)/g) || []).length) {
          url = url.slice(0, -1);
        }
        const href = safeHref(url);
        if (href) {
          flush();
          out.push(linkNode(href, [{ text: url }]));
          i += url.length;
          continue;
        }
      }
    }

    buf += c;
    i++;
  }
  flush();
  return out;
}

/** For each "[" in s, the index of its matching "]" (escapes skipped), in one linear pass. */
function matchBrackets(s) {
  const match = new Map();
  const stack = [];
  for (let k = 0; k < s.length; k++) {
    const ch = s[k];
    if (ch === "\\") k++;
    else if (ch === "[") stack.push(k);
    else if (ch === "]" && stack.length) match.set(stack.pop(), k);
  }
  return match;
}

/** [label](dest "title") starting at s[i] === "["; null if it is not one. */
function parseLink(s, i, brackets) {
  const k = brackets.get(i);
  if (k === undefined || s[k + 1] !== "(") return null;
  const label = s.slice(i + 1, k);
  let p = k + 2;
  while (s[p] === " " || s[p] === "\n") p++;
  let dest = "";
  if (s[p] === "<") {
    const close = s.indexOf(">", p);
    if (close === -1 || close - p > 2048) return null;
    dest = s.slice(p + 1, close);
    p = close + 1;
  } else {
    let parens = 0;
    const startP = p;
    const limit = Math.min(s.length, startP + 2048);
    while (p < limit) {
      const code = s.charCodeAt(p);
      if (code <= 32) break; // whitespace or control: the destination ends
      if (code === 40) parens++; // (
      else if (code === 41) {
        // )
        if (parens === 0) break;
        parens--;
      }
      p++;
    }
    dest = s.slice(startP, p);
  }
  while (s[p] === " " || s[p] === "\n") p++;
  const q = s[p];
  if (q === '"' || q === "'") {
    const close = s.indexOf(q, p + 1);
    if (close === -1) return null;
    p = close + 1;
    while (s[p] === " ") p++;
  }
  if (s[p] !== ")") return null;
  return { label, dest, end: p + 1 };
}
