/** Which transport the page streams over (SSE or WebSocket), as its toggle says; remembered. */

const KEY = "streamchat.transport";

export class TransportChoice {
  /** `onChange(name)` runs when the user picks the other one. */
  constructor(select, onChange) {
    this.select = select;
    select.value = localStorage.getItem(KEY) === "ws" ? "ws" : "sse";
    select.addEventListener("change", () => {
      localStorage.setItem(KEY, this.name);
      onChange(this.name);
    });
  }

  get name() {
    return this.select.value === "ws" ? "ws" : "sse";
  }
}
