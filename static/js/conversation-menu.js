/**
 * One sidebar conversation's "⋯" menu: Pin (or Unpin) and Archive (or Unarchive).
 *
 * A disclosure, as the top bar's menu (topbar-menu.js): the button says whether its panel is open
 * (aria-expanded) and, while it is, which it is (aria-controls); the panel follows it, so Tab
 * walks into its buttons. Escape closes it and puts the focus back on the button; so does focus
 * or a click leaving it. Only one is open at a time. The panel exists only while open: a closed
 * menu adds no text to its item.
 */

import { h, icon } from "./dom.js";

let openMenu = null; // the open menu's close function
let listening = false;

function closeOnClickOutside() {
  if (listening) return;
  listening = true;
  document.addEventListener("pointerdown", (e) => {
    if (openMenu && !e.target.closest(".conv-more, .conv-menu")) openMenu(false);
  });
}

/**
 * The menu's button, for the conversation `c` titled `title` (its panel goes after it).
 * @param onPin      (): pin it, or unpin it when it is pinned
 * @param onArchive  (): archive it, or unarchive it when it is archived
 */
export function conversationMenu(c, title, { onPin, onArchive }) {
  closeOnClickOutside();
  const panelId = `conv-menu-${c.id}`;
  const button = h("button", {
    type: "button", class: "btn btn-icon btn-small conv-more", "data-testid": "conversation-menu",
    "aria-label": `More actions for “${title}”`, title: "More", "aria-expanded": "false",
  }, icon("more"));
  let panel = null;

  function close(refocus) {
    if (openMenu === close) openMenu = null;
    button.setAttribute("aria-expanded", "false");
    button.removeAttribute("aria-controls");
    panel?.remove();
    panel = null;
    if (refocus) button.focus();
  }

  function open() {
    openMenu?.(false);
    openMenu = close;
    const item = (label, testid, action) => h("button", {
      type: "button", class: "btn btn-small", "data-testid": testid,
      onclick: () => {
        close(false);
        action();
      },
    }, label);
    panel = h("div", {
      class: "conv-menu", id: panelId, role: "group", "aria-label": `Actions for “${title}”`,
      "data-testid": "conversation-menu-panel",
    },
    item(c.pinned_at ? "Unpin" : "Pin", "pin-conversation", onPin),
    item(c.archived_at ? "Unarchive" : "Archive", "archive-conversation", onArchive));
    panel.addEventListener("keydown", onEscape);
    panel.addEventListener("focusout", (e) => {
      if (e.relatedTarget && !panel?.contains(e.relatedTarget) && e.relatedTarget !== button) close(false);
    });
    button.after(panel);
    button.setAttribute("aria-expanded", "true");
    button.setAttribute("aria-controls", panelId);
  }

  function onEscape(e) {
    if (e.key !== "Escape" || !panel) return;
    e.preventDefault(); // this Esc closes the menu; it does not stop a reply (chat.js)
    e.stopPropagation();
    close(true);
  }

  button.addEventListener("click", () => (panel ? close(false) : open()));
  button.addEventListener("keydown", onEscape);
  return button;
}
