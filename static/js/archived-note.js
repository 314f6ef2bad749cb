/**
 * The note over an archived conversation's messages: it is out of the list (opened from search,
 * the Archived view or its address); its Unarchive button brings it back, and so does a message
 * sent into it (the server unarchives it with the new turn).
 */

import { api, enc } from "./api.js";

export class ArchivedNote {
  /**
   * @param note       the note (a banner, hidden unless the open conversation is archived)
   * @param button     its Unarchive button
   * @param current    () => the open conversation's id
   * @param onFresh    (conversation): the server's answer (the list moves it back)
   * @param announce   reads a short status out to screen readers
   * @param onDone     (): unarchived (the page puts the focus back on the composer)
   */
  constructor({ note, button, current, onFresh, announce, onDone }) {
    this.note = note;
    button.addEventListener("click", async () => {
      try {
        onFresh(await api.patch(`/api/conversations/${enc(current())}`, { archived: false }));
        announce("Conversation unarchived.");
        onDone();
      } catch (err) {
        announce(`Could not unarchive: ${err.detail || err.message}`);
      }
    });
  }

  /** Shown for an archived conversation `c` (null: none open). */
  show(c) {
    this.note.hidden = !c?.archived_at;
  }
}
