// Unit tests for the safe Markdown renderer: node --test tests/js/
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseMarkdown, nodeToDOM, renderMarkdown, safeHref, plainText, ALLOWED_TAGS } from "../../static/js/markdown.js";
import { makeDocument, elements, serialize } from "./dom-shim.mjs";

const doc = makeDocument();
const html = (src) => serialize(renderMarkdown(src, doc));

const ALLOWED_ATTRS = {
  a: ["href", "rel", "target"],
  code: ["class"],
  ol: ["start"],
  th: ["class"],
  td: ["class"],
  span: ["class"],
};

function assertSafe(src) {
  const frag = renderMarkdown(src, doc);
  for (const el of elements(frag)) {
    assert.ok(ALLOWED_TAGS.has(el.localName), `tag <${el.localName}> from ${JSON.stringify(src)}`);
    for (const [name, value] of el.attributes) {
      assert.ok((ALLOWED_ATTRS[el.localName] || []).includes(name), `attr ${name} on <${el.localName}>`);
      assert.ok(!/^on/i.test(name));
      if (el.localName === "span") assert.match(value, /^hljs-[a-z]+(-[a-z]+)*$/, `span class ${value}`);
      if (name === "href") {
        assert.match(value, /^https?:\/\//, `href ${value}`);
        assert.equal(el.getAttribute("rel"), "noopener noreferrer nofollow");
      }
    }
  }
  return frag;
}

const XSS = [
  "<script>alert(1)</script>",
  "<img src=x onerror=alert(1)>",
  '<a href="javascript:alert(1)">x</a>',
  "<svg/onload=alert(1)>",
  "<iframe src=//evil.example></iframe>",
  "<style>*{display:none}</style>",
  "<!-- comment --><b>bold?</b>",
  "[x](javascript:alert(1))",
  "[x](JaVaScRiPt:alert(1))",
  "[x]( javascript:alert(1) )",
  "[x](java\tscript:alert(1))",
  "[x](&#106;avascript:alert(1))",
  "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
  "[x](vbscript:msgbox(1))",
  "[x](//evil.example/path)",
  "[x](/relative/path)",
  '[x](https://ok.example" onmouseover="alert(1))',
  "[x](<javascript:alert(1)>)",
  "[<img src=x onerror=alert(1)>](https://ok.example)",
  "![x](javascript:alert(1))",
  "![tracker](https://evil.example/pixel.png)",
  "<javascript:alert(1)>",
  "<https://ok.example/\"onmouseover=alert(1)>",
  'https://ok.example/"><script>alert(1)</script>',
  '```"><script>alert(1)</script>\ncode\n```',
  "```js onload=alert(1)\nx\n```",
  "`<script>alert(1)</script>`",
  "| <b>h</b> | x |\n|---|---|\n| <script>s</script> | [a](javascript:x) |",
  "> <script>alert(1)</script>\n> [a](javascript:x)",
  "- <img src=x onerror=alert(1)>\n  - [a](javascript:x)",
  "# <script>alert(1)</script>",
  "**<script>**alert(1)*</script>*",
  "\u0000<script>\u0000",
  "[a](https://ok.example\u0000javascript:alert(1))",
  "[a](https://ok.example\u2028x)",
];

for (const payload of XSS) {
  test(`XSS payload renders only allowed nodes: ${JSON.stringify(payload).slice(0, 60)}`, () => {
    assertSafe(payload);
  });
}

test("raw HTML is shown as text, not parsed", () => {
  assert.equal(html("<script>alert(1)</script>"), "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>");
  assert.equal(html("<b>x</b>"), "<p>&lt;b&gt;x&lt;/b&gt;</p>");
});

test("javascript: and relative links keep their words but lose the link", () => {
  assert.equal(html("[click](javascript:alert(1))"), "<p>click</p>");
  assert.equal(html("[home](/)"), "<p>home</p>");
  assert.equal(html("[x](//evil.example)"), "<p>x</p>");
});

test("images are never loaded: rendered as links when the URL is http(s)", () => {
  assert.equal(
    html("![alt text](https://img.example/a.png)"),
    '<p><a href="https://img.example/a.png" rel="noopener noreferrer nofollow" target="_blank">alt text</a></p>',
  );
});

test("safeHref", () => {
  assert.equal(safeHref("https://example.com/a?b=c#d"), "https://example.com/a?b=c#d");
  assert.equal(safeHref("HTTP://Example.com"), "http://example.com/");
  assert.equal(safeHref("https://example.com/<x>"), "https://example.com/%3Cx%3E");
  for (const bad of ["javascript:alert(1)", "data:text/html,x", "ftp://x", "//x", "/x", "https://exa mple.com", "mailto:a@b", "", null]) {
    assert.equal(safeHref(bad), null, String(bad));
  }
});

test("links, autolinks and bare URLs", () => {
  assert.equal(
    html("see [the docs](https://docs.example/x \"title\") now"),
    '<p>see <a href="https://docs.example/x" rel="noopener noreferrer nofollow" target="_blank">the docs</a> now</p>',
  );
  assert.equal(
    html("go to https://example.com/a_b. Then"),
    '<p>go to <a href="https://example.com/a_b" rel="noopener noreferrer nofollow" target="_blank">https://example.com/a_b</a>. Then</p>',
  );
  assert.equal(
    html("(see https://en.wikipedia.org/wiki/Foo_(bar))"),
    '<p>(see <a href="https://en.wikipedia.org/wiki/Foo_(bar)" rel="noopener noreferrer nofollow" target="_blank">https://en.wikipedia.org/wiki/Foo_(bar)</a>)</p>',
  );
  assert.equal(
    html("<https://example.com>"),
    '<p><a href="https://example.com/" rel="noopener noreferrer nofollow" target="_blank">https://example.com</a></p>',
  );
  // no nested links
  const frag = renderMarkdown("[https://a.example](https://b.example)", doc);
  assert.equal([...elements(frag)].filter((e) => e.localName === "a").length, 1);
});

test("fenced code blocks keep their text exactly, with a sanitised language class", () => {
  // A language highlight.js is not given (highlighted code: tests/js/highlight.test.mjs).
  const src = "Here:\n\n```pseudo\nif a < b and c > d:\n    print('<b>**not bold**</b>')\n```\nafter";
  assert.equal(
    html(src),
    "<p>Here:</p><pre><code class=\"language-pseudo\">if a &lt; b and c &gt; d:\n    print('&lt;b&gt;**not bold**&lt;/b&gt;')</code></pre><p>after</p>",
  );
  assert.equal(html("~~~\n```\ninside\n~~~"), "<pre><code>```\ninside</code></pre>");
  assert.equal(html("```\"><script>\nx\n```"), "<pre><code>x</code></pre>");
});

test("an unclosed fence (mid-stream) runs to the end, not highlighted yet", () => {
  const midStream = serialize(renderMarkdown("text\n```js\nconst a = 1;\nconst b", doc, { final: false }));
  assert.equal(midStream, '<p>text</p><pre><code class="language-js">const a = 1;\nconst b</code></pre>');
});

test("headings, rules, quotes", () => {
  assert.equal(html("# Title\n## Sub ##\n---\n> quoted *em*\n> more"), "<h1>Title</h1><h2>Sub</h2><hr><blockquote><p>quoted <em>em</em><br>more</p></blockquote>");
});

test("emphasis, strong, del, inline code", () => {
  // ***both***: CommonMark puts strong inside em (the spec's "***strong emph***" example)
  assert.equal(html("**bold** and *em* and ***both*** and ~~gone~~"), "<p><strong>bold</strong> and <em>em</em> and <em><strong>both</strong></em> and <del>gone</del></p>");
  assert.equal(html("*foo **bar** baz*"), "<p><em>foo <strong>bar</strong> baz</em></p>");
  assert.equal(html("snake_case_name and 2 * 3 * 4"), "<p>snake_case_name and 2 * 3 * 4</p>");
  assert.equal(html("`a **b** <c>` and ``x ` y``"), "<p><code>a **b** &lt;c&gt;</code> and <code>x ` y</code></p>");
  assert.equal(html("\\*not em\\*"), "<p>*not em*</p>");
  assert.equal(html("**unclosed bold"), "<p>**unclosed bold</p>");
});

test("single newlines are line breaks", () => {
  assert.equal(html("a\nb"), "<p>a<br>b</p>");
});

test("lists: tight, loose, ordered with start, nested", () => {
  assert.equal(html("- a\n- b"), "<ul><li>a</li><li>b</li></ul>");
  assert.equal(html("1. a\n2. b"), "<ol><li>a</li><li>b</li></ol>");
  assert.equal(html("3) a\n4) b"), '<ol start="3"><li>a</li><li>b</li></ol>');
  assert.equal(html("- a\n\n- b"), "<ul><li><p>a</p></li><li><p>b</p></li></ul>");
  assert.equal(html("- a\n  - b\n  - c\n- d"), "<ul><li>a<ul><li>b</li><li>c</li></ul></li><li>d</li></ul>");
  assert.equal(
    html("1. step\n   ```sh\n   ls\n   ```\n2. next"),
    '<ol><li>step<pre><code class="language-sh"><span class="hljs-built-in">ls</span></code></pre></li><li>next</li></ol>',
  );
  assert.equal(html("para\n- item"), "<p>para</p><ul><li>item</li></ul>");
});

test("tables", () => {
  assert.equal(
    html("| a | b |\n|:--|--:|\n| 1 | **2** |\n| 3 |"),
    '<table><thead><tr><th class="align-left">a</th><th class="align-right">b</th></tr></thead>' +
      '<tbody><tr><td class="align-left">1</td><td class="align-right"><strong>2</strong></td></tr>' +
      '<tr><td class="align-left">3</td><td class="align-right"></td></tr></tbody></table>',
  );
});

test("unicode text is kept as is", () => {
  const s = "héllo 👋🏽 日本語 שלום مرحبا";
  assert.equal(plainText(parseMarkdown(s)), s);
});

test("plainText of a tree", () => {
  assert.equal(plainText(parseMarkdown("**a** b\nc")), "a b\nc");
});

test("nodeToDOM re-checks the allowlists, whatever the tree says", () => {
  const evil = [
    { tag: "script", children: [{ text: "alert(1)" }] },
    { tag: "a", attrs: { href: "javascript:alert(1)", onclick: "x", rel: "noopener noreferrer nofollow" }, children: [{ text: "x" }] },
    { tag: "code", attrs: { class: "language-x onload" }, children: [] },
    { tag: "p", attrs: { style: "x" }, children: [{ text: "<b>t</b>" }] },
    { tag: "img", attrs: { src: "https://x.example/a.png" }, children: [] },
    { tag: "ol", attrs: { start: "1 onload=x" }, children: [{ tag: "li", children: [{ text: "i" }] }] },
  ];
  assert.equal(
    evil.map((node) => serialize(nodeToDOM(node, doc))).join(""),
    'alert(1)<a rel="noopener noreferrer nofollow">x</a><code></code><p>&lt;b&gt;t&lt;/b&gt;</p><ol><li>i</li></ol>',
  );
});

// A cheap fuzzer: random mixtures of Markdown syntax and HTML fragments.
function rng(seed) {
  return () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x7fffffff;
  };
}
const PIECES = [
  "*", "**", "_", "__", "~~", "`", "```", "[", "]", "(", ")", "<", ">", "!", "\\", "\n", "\n\n", " ", "|", "-", "#", "1.",
  "javascript:alert(1)", "https://x.example/", "<script>", "</script>", "<img src=x onerror=alert(1)>", "\"", "'", "a", "日本", "👋",
  "&lt;", "on", "=", "\r\n", "> ", "  ", "\t",
];

test("fuzz: random input renders only allowed nodes", () => {
  const r = rng(12345);
  for (let n = 0; n < 3000; n++) {
    let s = "";
    const len = Math.floor(r() * 40);
    for (let k = 0; k < len; k++) s += PIECES[Math.floor(r() * PIECES.length)];
    assertSafe(s);
  }
});

test("pathological input stays fast", () => {
  for (const unit of ["*", "**a", "[", "`", "_a", "[a](", "> ", "- ", "~~", "<http", "***x "]) {
    const s = unit.repeat(Math.ceil(40000 / unit.length));
    const t0 = performance.now();
    renderMarkdown(s, doc);
    const ms = performance.now() - t0;
    assert.ok(ms < 1500, `${JSON.stringify(unit)} took ${ms.toFixed(0)} ms`);
  }
});
