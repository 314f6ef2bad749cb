/**
 * Syntax highlighting for fenced code, as a plain tree (no HTML strings).
 *
 * highlight.js (vendor/highlight/, see vendor/README.md) is asked only for its token tree, never for
 * its HTML: `hljs.highlight()` returns the `TokenTreeEmitter` it filled as `_emitter`, whose `root`
 * is `{scope?, children: [string | node]}` (vendor/highlight/core.min.js; readable in the npm
 * package's es/core.js: `class TokenTree`, `get root()`, and `_emitter: emitter` in `_highlight`'s
 * result). That tree becomes markdown.js's tree: `{tag: "span", attrs: {class: "hljs-keyword"}}`
 * elements and `{text}` leaves, which markdown.js's allow-list builder turns into DOM like any other
 * node (span only inside code, class only `hljs-<letters>`), so the code's text stays text.
 *
 * Only fences that name a language we ship are highlighted (no guessing: `highlightAuto` tries
 * every grammar, too slow for a page that re-parses while it streams), and each (language, code)
 * pair is highlighted once: the page re-parses a growing reply on every frame, and the closed
 * blocks above the growing one come back from the cache.
 */

import hljs from "./vendor/highlight/core.min.js";
import bash from "./vendor/highlight/languages/bash.min.js";
import c from "./vendor/highlight/languages/c.min.js";
import cpp from "./vendor/highlight/languages/cpp.min.js";
import css from "./vendor/highlight/languages/css.min.js";
import diff from "./vendor/highlight/languages/diff.min.js";
import go from "./vendor/highlight/languages/go.min.js";
import java from "./vendor/highlight/languages/java.min.js";
import javascript from "./vendor/highlight/languages/javascript.min.js";
import json from "./vendor/highlight/languages/json.min.js";
import markdown from "./vendor/highlight/languages/markdown.min.js";
import python from "./vendor/highlight/languages/python.min.js";
import rust from "./vendor/highlight/languages/rust.min.js";
import shell from "./vendor/highlight/languages/shell.min.js";
import sql from "./vendor/highlight/languages/sql.min.js";
import typescript from "./vendor/highlight/languages/typescript.min.js";
import xml from "./vendor/highlight/languages/xml.min.js";
import yaml from "./vendor/highlight/languages/yaml.min.js";

const GRAMMARS = { bash, c, cpp, css, diff, go, java, javascript, json, markdown, python, rust, shell, sql, typescript, xml, yaml };
for (const [name, grammar] of Object.entries(GRAMMARS)) hljs.registerLanguage(name, grammar);

/** The class a highlight.js scope gets: its first part ("title.function" -> "hljs-title"). */
const SCOPE = /^([a-z]+(?:_[a-z]+)*)(?:\.[a-z_.]+)?$/;
const scopeClass = (scope) => {
  const m = SCOPE.exec(scope || "");
  return m ? `hljs-${m[1].replace(/_/g, "-")}` : null;
};

const CACHE_SIZE = 200;
const cache = new Map();

/**
 * The highlighted tree of `code` as `lang`: an array of `{text}` leaves and span nodes, or null
 * when `lang` is not a language we ship (the caller keeps the code as one text leaf).
 */
export function highlightCode(code, lang) {
  if (!lang || !hljs.getLanguage(lang)) return null;
  const key = `${lang}\u0000${code}`;
  if (cache.has(key)) return cache.get(key);
  let tree = null;
  try {
    const result = hljs.highlight(code, { language: lang, ignoreIllegals: true });
    tree = toNodes(result._emitter?.root?.children || []);
  } catch {
    tree = null; // a grammar that throws leaves its code plain
  }
  // The highlighted text must be the code itself, unchanged; anything else is not shown.
  if (tree && tree.map(textOf).join("") !== code) tree = null;
  if (cache.size >= CACHE_SIZE) cache.delete(cache.keys().next().value);
  cache.set(key, tree);
  return tree;
}

/** highlight.js's nodes -> ours. A scope we cannot name (an embedded language) keeps only its children. */
function toNodes(children) {
  const out = [];
  const add = (node) => {
    const last = out[out.length - 1];
    if (typeof node.text === "string" && last && typeof last.text === "string") last.text += node.text;
    else out.push(node);
  };
  for (const child of children) {
    if (typeof child === "string") {
      if (child) add({ text: child });
      continue;
    }
    const inner = toNodes(child.children || []);
    const cls = scopeClass(child.scope);
    if (cls && inner.length) out.push({ tag: "span", attrs: { class: cls }, children: inner });
    else inner.forEach(add);
  }
  return out;
}

function textOf(node) {
  return typeof node.text === "string" ? node.text : (node.children || []).map(textOf).join("");
}
