/** The offline banner: shown while the browser is offline; `onOffline` runs as it goes offline. */
export function watchConnectivity(banner, onOffline) {
  const show = () => {
    const offline = navigator.onLine === false;
    banner.textContent = offline ? "You are offline. Replies will resume when the connection is back." : "";
    banner.hidden = !offline;
  };
  window.addEventListener("offline", () => {
    show();
    onOffline();
  });
  window.addEventListener("online", show);
  show();
}
