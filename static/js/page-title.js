/**
 * The open conversation's title, in the top bar (#conv-title) and the browser's tab.
 */

import { $ } from "./dom.js";

export function setTitle(text) {
  const title = $("#conv-title");
  title.textContent = text;
  title.title = text; // the whole title on hover, where it is cut short
  document.title = `${text} · StreamChat`;
}
