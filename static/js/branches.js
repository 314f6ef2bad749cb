/**
 * Versions of a message (edit and branch): the "‹ 2/3 ›" switcher under every message that has
 * siblings (edited questions, regenerated replies), and Edit on the user's own messages, with its
 * inline editor.
 *
 * No page state here, as in message-view.js: the controls say what the user asked for with events
 * that bubble from the message (each with `detail.view`): "message-branch" (`detail.messageId`:
 * the version to show) and "message-edit" (`detail.content`: the new words). A view's versions
 * are `view.siblings`, the ids of its turn's versions, oldest first (the server's `siblings`).
 */

import { h } from "./dom.js";

/** Give a view its versions (from the server's row, or made on the page) and redraw it. */
export function showVersions(view, siblings) {
  view.siblings = siblings && siblings.length ? siblings.map(String) : [];
  view.update();
}

/** The versions a new version of `view` joins: its own, and the new id at the end. */
export function withNewVersion(view, newId) {
  const known = view.siblings?.length ? view.siblings : [view.reply.messageId];
  return [...known.filter(Boolean), String(newId)];
}

function emit(view, type, detail) {
  view.el.dispatchEvent(new CustomEvent(type, { bubbles: true, detail: { view, ...detail } }));
}

function switcher(view) {
  const ids = view.siblings || [];
  const at = ids.indexOf(view.reply.messageId);
  if (ids.length < 2 || at === -1) return null;
  const busy = view.reply.status === "streaming" || view.reply.status === "sending";
  const go = (step, which) =>
    h("button", {
      type: "button",
      class: "btn btn-small branch-step",
      "data-testid": `branch-${which}`,
      "aria-label": which === "prev" ? "Show the previous version" : "Show the next version",
      disabled: busy || !ids[at + step],
      onclick: () => emit(view, "message-branch", { messageId: ids[at + step], which }),
    }, which === "prev" ? "‹" : "›");
  return h(
    "div",
    { class: "branch-switcher", role: "group", "aria-label": "Versions", "data-testid": "branch-switcher" },
    go(-1, "prev"),
    h("span", { class: "branch-position", "data-testid": "branch-position", "aria-label": `Version ${at + 1} of ${ids.length}` }, `${at + 1}/${ids.length}`),
    go(1, "next"),
  );
}

function editor(view) {
  const input = h("textarea", {
    class: "branch-edit-input",
    "data-testid": "edit-input",
    "aria-label": "Edit your message",
    rows: "3",
    maxlength: "16000",
    dir: "auto",
  });
  input.value = view.reply.text;
  const close = () => {
    view.editing = false;
    view.update();
    view.el.querySelector("[data-testid=edit]")?.focus();
  };
  const save = () => {
    const content = input.value;
    if (!content.trim()) return;
    view.editing = false;
    emit(view, "message-edit", { content });
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.preventDefault(); // the page's Esc stops a reply; here it only closes the editor
      close();
    } else if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      save();
    }
  });
  setTimeout(() => input.focus(), 0);
  return h(
    "div",
    { class: "branch-editor", "data-testid": "editor" },
    input,
    h("div", { class: "branch-editor-actions" },
      h("button", { type: "button", class: "btn btn-small", "data-testid": "edit-cancel", onclick: close }, "Cancel"),
      h("button", { type: "button", class: "btn btn-small btn-primary", "data-testid": "edit-save", onclick: save }, "Send"),
    ),
  );
}

/** Draw the view's versions switcher and (the user's messages) Edit or the editor; called by
 * MessageView.update(). */
export function renderBranchControls(view) {
  if (!view.branchEl) {
    view.branchEl = h("div", { class: "msg-branch" });
    view.metaEl.before(view.branchEl);
  }
  const parts = [];
  const editable = view.role === "user" && view.reply.messageId && view.reply.status === "completed";
  view.textEl.hidden = !!(editable && view.editing);
  if (editable && view.editing) parts.push(editor(view));
  else {
    const versions = switcher(view);
    if (versions) parts.push(versions);
    if (editable) {
      parts.push(
        h("button", {
          type: "button", class: "btn btn-small branch-edit", "data-testid": "edit", "aria-label": "Edit this message",
          onclick: () => {
            view.editing = true;
            view.update();
          },
        }, "Edit"),
      );
    }
  }
  view.branchEl.replaceChildren(...parts);
}
