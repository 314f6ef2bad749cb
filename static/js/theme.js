/*
 * The page's theme: light or dark. theme.css follows the system setting (prefers-color-scheme)
 * unless <html data-theme="light|dark"> says otherwise; this sets it from the choice remembered in
 * localStorage. A classic script in <head>, not a module (modules run after parsing), so the
 * choice applies before the first paint: no flash of the other theme.
 *
 * Every [data-theme-toggle] button switches between the two and says which is on (aria-pressed:
 * "dark theme" pressed). A choice equal to the system's own is forgotten, so the page follows the
 * system again; other tabs follow through the storage event.
 */
(() => {
  const KEY = "theme";
  const root = document.documentElement;
  const systemDark = window.matchMedia("(prefers-color-scheme: dark)");

  const remembered = () => {
    try {
      const value = localStorage.getItem(KEY);
      return value === "light" || value === "dark" ? value : null;
    } catch {
      return null; // storage blocked: follow the system
    }
  };
  const system = () => (systemDark.matches ? "dark" : "light");
  const current = () => root.dataset.theme || system();

  const apply = (choice) => {
    if (choice) root.dataset.theme = choice;
    else delete root.dataset.theme;
    for (const button of document.querySelectorAll("[data-theme-toggle]")) {
      button.setAttribute("aria-pressed", String(current() === "dark"));
    }
  };

  const toggle = () => {
    const next = current() === "dark" ? "light" : "dark";
    const choice = next === system() ? null : next;
    try {
      if (choice) localStorage.setItem(KEY, choice);
      else localStorage.removeItem(KEY);
    } catch {
      // not remembered; this page still switches
    }
    apply(choice);
  };

  apply(remembered());
  document.addEventListener("DOMContentLoaded", () => apply(root.dataset.theme || null));
  document.addEventListener("click", (e) => {
    if (e.target instanceof Element && e.target.closest("[data-theme-toggle]")) toggle();
  });
  systemDark.addEventListener("change", () => apply(root.dataset.theme || null));
  window.addEventListener("storage", (e) => {
    if (e.key === KEY || e.key === null) apply(remembered());
  });
})();
