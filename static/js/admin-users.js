/**
 * The users page: forms marked `data-confirm` ask first (disable, delete); a one-time link is
 * selected for copying. Everything else is plain forms the server renders.
 */

for (const form of document.querySelectorAll("form[data-confirm]")) {
  form.addEventListener("submit", (e) => {
    if (!window.confirm(form.dataset.confirm)) e.preventDefault();
  });
}

const link = document.querySelector("[data-testid=link-value]");
if (link) {
  link.addEventListener("focus", () => link.select());
  link.focus();
}
