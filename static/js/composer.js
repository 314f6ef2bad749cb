/**
 * The composer: a text box that grows with its text, Enter to send (Shift+Enter for a new line),
 * and one button that is Send, or Stop while the open conversation's reply streams (as chat apps
 * do: one reply at a time). Enter while a reply streams says so instead of doing nothing, and the
 * draft stays. Its error line says why a message was not sent. Send waits while the draft is too
 * long for the model (`setTooLong`, from context-view.js, which says why beside it). What sending
 * and stopping do is the page's (hooks).
 */

const BUSY = "A reply is still being written: stop it (Stop or Esc) or wait for it to finish, then send.";
const HINTS = {
  idle: "Enter sends · Shift+Enter adds a line · Esc stops a reply",
  streaming: "Replying… Stop or Esc ends the reply · your next message can wait here",
};

import { showError } from "./dom.js";

export class Composer {
  /**
   * @param form, input, send, error  the composer's elements
   * @param isBusy  () => true while a reply streams here (then the button stops it)
   * @param onSend  (content, t0) with t0 = performance.now() when the user pressed Send
   * @param onStop  ()
   */
  constructor({ form, input, send, error, isBusy, onSend, onStop }) {
    Object.assign(this, { form, input, send, error, isBusy });
    this.hint = form.querySelector(".composer-hint");

    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (isBusy()) {
        onStop();
        return;
      }
      const content = input.value;
      if (!content.trim() || this.tooLong) {
        input.focus();
        return;
      }
      const t0 = performance.now();
      input.value = "";
      this.autosize();
      onSend(content, t0);
      input.focus();
    });
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
        e.preventDefault();
        if (!isBusy()) form.requestSubmit();
        else if (input.value.trim()) this.showError(BUSY);
      }
    });
    input.addEventListener("input", () => {
      this.autosize();
      if (!error.hidden) this.showError("");
    });
  }

  showError(text) {
    showError(this.error, text);
  }

  focus() {
    this.input.focus();
  }

  /** A message the server refused: back in the box, unless the user has typed something since. */
  restore(content) {
    if (!this.input.value) this.input.value = content;
  }

  /** Send, or Stop while a reply streams. */
  setStreaming(streaming) {
    const send = this.send;
    send.dataset.state = streaming ? "streaming" : "idle";
    send.textContent = streaming ? "Stop" : "Send";
    send.setAttribute("aria-label", streaming ? "Stop the reply" : "Send");
    send.classList.toggle("btn-stop", streaming);
    send.disabled = !streaming && !!this.tooLong; // Stop always works
    if (this.hint) this.hint.textContent = HINTS[streaming ? "streaming" : "idle"];
    if (!streaming && this.error.textContent === BUSY) this.showError("");
  }

  /** The draft is too long to send (or fits again): Send waits, Stop never does. */
  setTooLong(over) {
    this.tooLong = over;
    this.send.disabled = over && this.send.dataset.state !== "streaming";
  }

  autosize() {
    const input = this.input;
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
  }
}
