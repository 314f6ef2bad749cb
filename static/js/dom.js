/**
 * DOM helpers shared by the pages: an element builder that only ever makes text nodes of text,
 * clipboard copy, a screen-reader announcer, dialogs, error lines and a few stroke icons.
 */

/**
 * A tiny element builder. Text always becomes text nodes; there is no way to pass markup.
 *   h("button", {class: "x", "data-testid": "send", onclick: fn}, "Send")
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child)); // strings become text nodes
  }
  return el;
}

export const $ = (selector, root = document) => root.querySelector(selector);

/** Copy text to the clipboard; resolves true on success. */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const ta = h("textarea", { class: "sr-only", "aria-hidden": "true", readonly: true });
    ta.value = text;
    document.body.append(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    ta.remove();
    return ok;
  }
}

/** Briefly show that a button did its job ("Copied"), then restore its label. */
export function flash(button, label, ms = 1500) {
  const before = button.textContent;
  button.textContent = label;
  button.dataset.flash = "1";
  setTimeout(() => {
    button.textContent = before;
    delete button.dataset.flash;
  }, ms);
}

const SVG_NS = "http://www.w3.org/2000/svg";
const ICONS = {
  pencil: "M4 20h4L19 9l-4-4L4 16v4zM14 6l4 4",
  trash: "M4 7h16M10 11v6M14 11v6M6 7l1 13h10l1-13M9 7V4h6v3",
  more: "M6.5 12a1.5 1.5 0 1 1-3 0a1.5 1.5 0 1 1 3 0zM13.5 12a1.5 1.5 0 1 1-3 0a1.5 1.5 0 1 1 3 0zM20.5 12a1.5 1.5 0 1 1-3 0a1.5 1.5 0 1 1 3 0z",
};

/** A small stroke icon (fixed path data; decorative: the button carries the label). */
export function icon(name) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("width", "16");
  svg.setAttribute("height", "16");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  svg.setAttribute("class", "icon");
  const path = document.createElementNS(SVG_NS, "path");
  path.setAttribute("d", ICONS[name]);
  path.setAttribute("fill", "none");
  path.setAttribute("stroke", "currentColor");
  path.setAttribute("stroke-width", "2");
  path.setAttribute("stroke-linecap", "round");
  path.setAttribute("stroke-linejoin", "round");
  svg.append(path);
  return svg;
}

/**
 * A function that reads `text` out to screen readers through the live region `el`. The region is
 * emptied first and filled a moment later, so the same words said twice are announced twice.
 */
export function announcer(el) {
  let timer = 0;
  return (text) => {
    clearTimeout(timer);
    el.textContent = "";
    timer = setTimeout(() => {
      el.textContent = text;
    }, 50);
  };
}

/** A <dialog> that closes on its [data-close] buttons and on a click on its backdrop. */
export function closeOnDismiss(dialog) {
  dialog.addEventListener("click", (e) => {
    if (e.target.closest("[data-close]") || e.target === dialog) dialog.close();
  });
}

/** Show `text` in an error line (`el`), or hide the line when `text` is empty. */
export function showError(el, text) {
  el.textContent = text || "";
  el.hidden = !text;
}
