/**
 * The sidebar as a drawer on small screens: ☰ opens it over the chat, ✕, the backdrop or Esc
 * (the page's key handler) close it. On wide screens CSS always shows it and this does nothing
 * visible.
 */

export class Sidebar {
  /**
   * @param toggle    the ☰ button
   * @param close     the ✕ button inside the drawer
   * @param backdrop  the shade behind the open drawer
   * @param first     what gets focus when the drawer opens
   */
  constructor({ toggle, close, backdrop, first }) {
    Object.assign(this, { toggle, backdrop, first });
    toggle.addEventListener("click", () => (this.isOpen ? this.close() : this.open()));
    close.addEventListener("click", () => this.dismiss());
    backdrop.addEventListener("click", () => this.close());
  }

  get isOpen() {
    return document.body.classList.contains("sidebar-open");
  }

  open() {
    document.body.classList.add("sidebar-open");
    this.toggle.setAttribute("aria-expanded", "true");
    this.backdrop.hidden = false;
    this.first.focus();
  }

  /** Close it and put the focus back on ☰ (✕ or Esc). */
  dismiss() {
    this.close();
    this.toggle.focus();
  }

  close() {
    if (!this.isOpen) return;
    document.body.classList.remove("sidebar-open");
    this.toggle.setAttribute("aria-expanded", "false");
    this.backdrop.hidden = true;
  }
}
