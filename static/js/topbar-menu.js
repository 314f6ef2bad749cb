/**
 * The top bar's "⋯" menu on a phone: Export, Settings, the transport choice and the theme fold
 * into a panel that the button shows and hides (chat.css; on a wide screen the button is hidden
 * and the controls sit in the bar).
 *
 * A disclosure, not an ARIA menu: the panel holds ordinary controls (a select, a <details>), which
 * a role="menu" would hide from screen readers' normal reading. The button says whether it is open
 * (aria-expanded) and which panel it opens (aria-controls); the panel follows it, so Tab walks
 * into it. Escape closes it and puts focus back on the button; so do a click or focus outside it,
 * and picking one of its actions (Settings opens a dialog; a download leaves nothing to do).
 */

export class TopbarMenu {
  constructor({ button, panel }) {
    Object.assign(this, { button, panel });
    button.addEventListener("click", () => this.setOpen(!this.isOpen));
    const closeOnEscape = (e) => {
      if (e.key !== "Escape" || !this.isOpen) return;
      e.preventDefault(); // this Esc closes the menu; it does not stop the reply (chat.js)
      this.setOpen(false);
      button.focus();
    };
    button.addEventListener("keydown", closeOnEscape);
    panel.addEventListener("keydown", closeOnEscape);
    const within = (node) => node && (panel.contains(node) || button.contains(node));
    document.addEventListener("pointerdown", (e) => {
      if (this.isOpen && !within(e.target)) this.setOpen(false);
    });
    panel.addEventListener("focusout", (e) => {
      if (this.isOpen && e.relatedTarget && !within(e.relatedTarget)) this.setOpen(false);
    });
    panel.addEventListener("click", (e) => {
      if (e.target.closest("#open-settings, .export-items a")) this.setOpen(false);
    });
  }

  get isOpen() {
    return this.button.getAttribute("aria-expanded") === "true";
  }

  setOpen(open) {
    this.button.setAttribute("aria-expanded", String(open));
    this.panel.classList.toggle("is-open", open);
  }
}
