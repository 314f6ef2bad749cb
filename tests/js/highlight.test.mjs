// Highlighted code and the XSS boundary: node --test tests/js/
// highlight.js's output reaches the page only as markdown.js tree nodes built by its allow-list
// builder: <span class="hljs-..."> inside <code>, the code's own text as text nodes, nothing else.
import { test } from "node:test";
import assert from "node:assert/strict";
import { highlightCode } from "../../static/js/highlight.js";
import { nodeToDOM, parseMarkdown, renderMarkdown } from "../../static/js/markdown.js";
import { elements, makeDocument, serialize } from "./dom-shim.mjs";

const doc = makeDocument();
const html = (src, opts) => serialize(renderMarkdown(src, doc, opts));
const SPAN_CLASS = /^hljs-[a-z]+(-[a-z]+)*$/;
const LANGUAGES = [
  "bash", "sh", "c", "cpp", "css", "diff", "go", "java", "javascript", "js", "json", "markdown", "md", "python", "py",
  "rust", "shell", "sql", "typescript", "ts", "xml", "html", "svg", "yaml",
];

/** Every element is allowed; spans only inside <code>, with a highlight class and nothing else. */
function assertHighlightSafe(frag, where) {
  const check = (node, inCode) => {
    for (const el of node.childNodes || []) {
      if (el.nodeType !== 1) continue;
      if (el.localName === "span") {
        assert.ok(inCode, `${where}: a span outside <code>`);
        assert.deepEqual([...el.attributes.keys()], ["class"], `${where}: span attributes`);
        assert.match(el.getAttribute("class"), SPAN_CLASS, where);
      } else {
        assert.ok(["pre", "code", "p", "br"].includes(el.localName), `${where}: <${el.localName}>`);
        if (el.localName === "code") {
          for (const [name, value] of el.attributes) assert.ok(name === "class" && /^language-/.test(value), `${where}: ${name}`);
        }
      }
      check(el, inCode || el.localName === "code");
    }
  };
  check(frag, false);
}

const PAYLOADS = [
  "<script>alert(1)</script>",
  '<img src=x onerror="alert(1)">',
  "<svg/onload=alert(1)>",
  '"><iframe src="javascript:alert(1)"></iframe>',
  "</code></pre><script>alert(1)</script>",
  "<style>*{display:none}</style>",
  "&lt;script&gt; &#x3C;img&#x3E; \u0000 \u2028",
  "`${alert(1)}` /* </span><b> */ // <span class=x onclick=alert(1)>",
  '<a href="javascript:alert(1)" onmouseover="x">a</a>',
  "<!-- <script> --> <![CDATA[ <img src=x> ]]>",
];

for (const lang of LANGUAGES) {
  test(`highlighted ${lang} keeps payloads as text, in spans with hljs classes only`, () => {
    for (const payload of PAYLOADS) {
      const code = `x = "${payload}"\n// ${payload}\n# ${payload}\n${payload}`;
      const frag = renderMarkdown("```" + lang + "\n" + code + "\n```", doc);
      assertHighlightSafe(frag, `${lang}: ${payload}`);
      // (CommonMark turns NUL into U+FFFD before anything else sees the text.)
      assert.equal(frag.textContent, code.replace(/\u0000/g, "\uFFFD"), `${lang}: the text is the code, unchanged`);
    }
  });
}

test("closed fences in the languages shipped are highlighted", () => {
  for (const [lang, code] of [
    ["python", "def f(x):\n    return 1  # one"],
    ["js", "const a = `t${1}`; // c"],
    ["html", "<p class=\"a\">x</p>"],
    ["sql", "SELECT 1 FROM t WHERE a = 'b';"],
    ["bash", "echo \"$HOME\" | grep x"],
    ["rust", "fn main() { let x: u8 = 1; }"],
  ]) {
    const frag = renderMarkdown("```" + lang + "\n" + code + "\n```", doc);
    assert.ok([...elements(frag)].some((el) => el.localName === "span"), `${lang} got no spans`);
    assert.equal(frag.textContent, code);
  }
});

test("python is highlighted exactly", () => {
  assert.equal(
    html("```python\ndef f(x):\n    return '<b>' + x  # hi\n```"),
    '<pre><code class="language-python"><span class="hljs-keyword">def</span> <span class="hljs-title">f</span>' +
      '(<span class="hljs-params">x</span>):\n    <span class="hljs-keyword">return</span> ' +
      '<span class="hljs-string">\'&lt;b&gt;\'</span> + x  <span class="hljs-comment"># hi</span></code></pre>',
  );
});

test("an embedded language (script inside html) is highlighted with no scope of its own", () => {
  const out = html("```html\n<script>let a = 1</script>\n```");
  assert.match(out, /<span class="hljs-keyword">let<\/span>/);
  assert.doesNotMatch(out, /language:|hljs-language/);
});

test("highlighting waits for the closing fence while streaming, or for the end of the reply", () => {
  const open = "```python\ndef f():\n    pass";
  const plain = '<pre><code class="language-python">def f():\n    pass</code></pre>';
  assert.equal(html(open, { final: false }), plain, "growing fence: plain");
  assert.match(html(open + "\n```", { final: false }), /hljs-keyword/, "closed fence: highlighted mid-stream");
  assert.match(html(open + "\n```\nmore text", { final: false }), /hljs-keyword/);
  assert.match(html(open, { final: true }), /hljs-keyword/, "reply ended: highlighted");
  // Closed inside a quote and inside a list item, and a fence closed by a longer run.
  assert.match(html("> ```py\n> def f(): pass\n> ```", { final: false }), /hljs-keyword/);
  assert.match(html("- ```py\n  def f(): pass\n  ```\n- b", { final: false }), /hljs-keyword/);
  assert.match(html("~~~py\ndef f(): pass\n~~~~~", { final: false }), /hljs-keyword/);
  // Not closed: a fence indented by four spaces is content, and an empty last line is content.
  assert.doesNotMatch(html("```py\ndef f(): pass\n    ```", { final: false }), /hljs-/);
  assert.doesNotMatch(html("```py\ndef f(): pass\n\n", { final: false }), /hljs-/);
});

test("unknown or missing languages and indented code stay plain", () => {
  assert.equal(html("```klingon\nqaplah()\n```"), '<pre><code class="language-klingon">qaplah()</code></pre>');
  assert.equal(html("```\ndef f(): pass\n```"), "<pre><code>def f(): pass</code></pre>");
  assert.equal(html("    def f(): pass"), "<pre><code>def f(): pass</code></pre>");
  assert.equal(highlightCode("x", "klingon"), null);
  assert.equal(highlightCode("x", ""), null);
});

test("the builder re-checks spans: only inside <code>, only hljs classes", () => {
  const code = (...children) => ({ tag: "pre", children: [{ tag: "code", children }] });
  const span = (cls, text) => ({ tag: "span", attrs: { class: cls }, children: [{ text }] });
  const cases = [
    [span("hljs-keyword", "outside"), "outside"],
    [{ tag: "p", children: [span("hljs-keyword", "in p")] }, "<p>in p</p>"],
    [code(span("hljs-keyword", "ok")), '<pre><code><span class="hljs-keyword">ok</span></code></pre>'],
    [code(span("hljs-keyword x", "a")), "<pre><code><span>a</span></code></pre>"],
    [code(span("hljs-", "b")), "<pre><code><span>b</span></code></pre>"],
    [code(span("hljs-Keyword", "c")), "<pre><code><span>c</span></code></pre>"],
    [code(span("hljs-a1", "d")), "<pre><code><span>d</span></code></pre>"],
    [code(span('hljs-a" onclick="x', "e")), "<pre><code><span>e</span></code></pre>"],
    [code({ tag: "span", attrs: { class: "hljs-keyword", onclick: "x", style: "x" }, children: [] }), '<pre><code><span class="hljs-keyword"></span></code></pre>'],
    [code({ tag: "img", attrs: { class: "hljs-keyword", src: "x" }, children: [{ text: "<img>" }] }), "<pre><code>&lt;img&gt;</code></pre>"],
  ];
  for (const [tree, expected] of cases) assert.equal(serialize(nodeToDOM(tree, doc)), expected);
});

test("highlightCode: once per (language, code), the same tree after", () => {
  const a = highlightCode("let x = 1", "js");
  assert.ok(a && a.some((n) => n.tag === "span"));
  assert.equal(highlightCode("let x = 1", "js"), a);
  assert.notEqual(highlightCode("let x = 1", "ts"), a);
});

test("parseMarkdown's tree for highlighted code is plain data (the page keys blocks by its JSON)", () => {
  const tree = parseMarkdown("```js\nlet a = 1\n```");
  assert.deepEqual(JSON.parse(JSON.stringify(tree)), tree);
});

// A cheap fuzzer: random code in every shipped language keeps its text and stays in the allow-list.
function rng(seed) {
  return () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x7fffffff;
  };
}
const PIECES = [
  "<", ">", "</", "/>", "\"", "'", "`", "${", "}", "{", "(", ")", "//", "/*", "*/", "#", "--", "<script>", "<!--", "-->",
  "def ", "class ", "fn ", "let ", "SELECT ", "<img src=x onerror=alert(1)>", "\n", " ", "\t", "\\", "&amp;", "日本", "👋",
  "onload=", "=", ";", ":", "+", "@", "$", "0x1F", "1.5e3", "[", "]",
];

test("fuzz: random code highlights to its own text, allowed nodes only", () => {
  const r = rng(4242);
  const langs = ["python", "js", "ts", "html", "css", "bash", "sql", "json", "yaml", "rust", "go", "c", "cpp", "java", "md", "diff"];
  for (let n = 0; n < 800; n++) {
    let code = "";
    const len = 1 + Math.floor(r() * 30);
    for (let k = 0; k < len; k++) code += PIECES[Math.floor(r() * PIECES.length)];
    code = code.replace(/`{3,}|~{3,}/g, "`").trim() || "x";
    const lang = langs[n % langs.length];
    const frag = renderMarkdown("```" + lang + "\n" + code + "\n```", doc);
    assertHighlightSafe(frag, `${lang}: ${JSON.stringify(code)}`);
    assert.equal(frag.textContent, code, `${lang}: ${JSON.stringify(code)}`);
  }
});
