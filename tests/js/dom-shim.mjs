// A minimal DOM for node tests: just what markdown.js's nodeToDOM / renderMarkdown use. Setting innerHTML/outerHTML
// throws, so a test fails loudly if any code path tries to parse markup.
const TAG_NAME = /^[a-zA-Z][a-zA-Z0-9-]*$/;

class Node {
  constructor() {
    this.childNodes = [];
    this.parentNode = null;
  }
  appendChild(child) {
    if (child.nodeType === 11) {
      for (const c of [...child.childNodes]) this.appendChild(c);
      child.childNodes = [];
      return child;
    }
    this.childNodes.push(child);
    child.parentNode = this;
    return child;
  }
  get textContent() {
    return this.childNodes.map((c) => c.textContent).join("");
  }
}

class Element extends Node {
  constructor(tag) {
    super();
    if (!TAG_NAME.test(tag)) throw new Error(`InvalidCharacterError: ${tag}`);
    this.nodeType = 1;
    this.localName = tag.toLowerCase();
    this.tagName = tag.toUpperCase();
    this.attributes = new Map();
  }
  setAttribute(name, value) {
    if (!TAG_NAME.test(name)) throw new Error(`InvalidCharacterError: ${name}`);
    this.attributes.set(name.toLowerCase(), String(value));
  }
  getAttribute(name) {
    return this.attributes.has(name) ? this.attributes.get(name) : null;
  }
  set innerHTML(_) {
    throw new Error("innerHTML must not be used");
  }
  set outerHTML(_) {
    throw new Error("outerHTML must not be used");
  }
  insertAdjacentHTML() {
    throw new Error("insertAdjacentHTML must not be used");
  }
}

class Text {
  constructor(data) {
    this.nodeType = 3;
    this.data = String(data);
  }
  get textContent() {
    return this.data;
  }
}

class Fragment extends Node {
  constructor() {
    super();
    this.nodeType = 11;
  }
}

export function makeDocument() {
  return {
    createElement: (tag) => new Element(tag),
    createTextNode: (data) => new Text(data),
    createDocumentFragment: () => new Fragment(),
  };
}

/** Every element under `node` (depth-first), excluding `node` itself when it is a fragment. */
export function* elements(node) {
  for (const c of node.childNodes || []) {
    if (c.nodeType === 1) {
      yield c;
      yield* elements(c);
    }
  }
}

/** A compact HTML-like serialisation for assertions (text escaped). */
export function serialize(node) {
  if (node.nodeType === 3) return node.data.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const inner = node.childNodes.map(serialize).join("");
  if (node.nodeType === 11) return inner;
  const attrs = [...node.attributes].map(([k, v]) => ` ${k}="${v.replace(/"/g, "&quot;")}"`).join("");
  return node.localName === "br" || node.localName === "hr"
    ? `<${node.localName}${attrs}>`
    : `<${node.localName}${attrs}>${inner}</${node.localName}>`;
}
