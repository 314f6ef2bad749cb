/**
 * One sidebar conversation's "⋯" menu: Pin (or Unpin) and Archive (or Unarchive).
 *
 * A disclosure, as the top bar's menu (topbar-menu.js): the button says whether its panel is open
 * (aria-expanded) and which it is (aria-controls); the panel follows it, so Tab walks into its
 * buttons. Escape closes it and puts the focus back on the button; so does focus or a click
 * leaving it. Only one is open at a time.
 */

import { h } from "./dom.js";

let open = null; // the open menu's close function
let listening = false;

function closeOnClickOutside() {
  if (listening) return;
  listening = true;
  document.addEventListener("pointerdown", (e) => {
    if (open && !e.target.closest(".conv-more, .conv-menu")) open();
  });
}

/**
 * The menu's button and panel, for the conversation `c` titled `title`.
 * @param onPin      (): pin it, or unpin it when it is pinned
 * @param onArchive  (): archive it, or unarchive it when it is archived
 */
export function conversationMenu(c, title, { onPin, onArchive }) {
  closeOnClickOutside();
  const panelId = `conv-menu-${c.id}`;
  const button = h("button", {
    type: "button", class: "btn btn-icon btn-small conv-more", "data-testid": "conversation-menu",
    "aria-label": `More actions for “${title}”`, title: "More", "aria-expanded": "false", "aria-controls": panelId,
  }, h("span", { "aria-hidden": "true" }, "⋯"));
  const item = (label, testid, action) => h("button", {
    type: "button", class: "btn btn-small", "data-testid": testid,
    onclick: () => {
      close(false);
      action();
    },
  }, label);
  const panel = h("div", { class: "conv-menu", id: panelId, "data-testid": "conversation-menu-panel", hidden: true },
    item(c.pinned_at ? "Unpin" : "Pin", "pin-conversation", onPin),
    item(c.archived_at ? "Unarchive" : "Archive", "archive-conversation", onArchive),
  );
  // The menu's items are named by their text; it says whose they are.
  panel.setAttribute("aria-label", `Actions for “${title}”`);
  panel.setAttribute("role", "group");

  function close(refocus) {
    if (open === close) open = null;
    button.setAttribute("aria-expanded", "false");
    panel.hidden = true;
    if (refocus) button.focus();
  }
  button.addEventListener("click", () => {
    if (!panel.hidden) return close(false);
    open?.();
    open = close;
    button.setAttribute("aria-expanded", "true");
    panel.hidden = false;
  });
  const onEscape = (e) => {
    if (e.key !== "Escape" || panel.hidden) return;
    e.preventDefault(); // this Esc closes the menu; it does not stop a reply (chat.js)
    e.stopPropagation();
    close(true);
  };
  button.addEventListener("keydown", onEscape);
  panel.addEventListener("keydown", onEscape);
  panel.addEventListener("focusout", (e) => {
    if (e.relatedTarget && !panel.contains(e.relatedTarget) && e.relatedTarget !== button) close(false);
  });
  return [button, panel];
}
