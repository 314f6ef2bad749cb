"""How the chat page keeps up with a long reply (issue 11, item 7).

A 20,000-token reply from the synthetic engine, plain text and Markdown-heavy (the
``[[synthetic:markdown]]`` marker: headings, nested lists, tables, many fenced code blocks, long
inline code), streams into the real page in Debian's Chromium (Playwright). In the page: a
PerformanceObserver for `longtask` entries (main-thread tasks over 50 ms) and a
requestAnimationFrame loop (frames/s, the longest gap between frames), from the press of Send to
the reply's end state on screen (time to final). After the end, the page's DOM is compared with a
full render of the reply's text (`renderMarkdown`), so a fast renderer cannot be a wrong one.

With `--baseline-rev REV` the same runs are made with the page's scripts (static/js) of REV,
served by route interception from `git show`, in the same server and the same browser,
configurations interleaved (A B, B A, ...) so that load from other processes falls on both alike.

    python bench/long_reply_render.py [--tokens 20000] [--runs 2] [--step-ms 2] [--transport sse]
        [--baseline-rev REV] [--kinds plain,markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Route, sync_playwright  # noqa: E402

from tests.live_server import LiveServer  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "bench-password-123"

# Installed before the page's own scripts: long tasks and frames from the start.
PROBE_JS = """
window.__perf = { longtasks: [], frames: [], t0: null, tEnd: null };
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) window.__perf.longtasks.push([e.startTime, e.duration]);
}).observe({ type: "longtask", buffered: true });
const tick = (t) => { window.__perf.frames.push(t); requestAnimationFrame(tick); };
requestAnimationFrame(tick);
new MutationObserver(() => {
  const el = document.querySelector("article[data-role=assistant]");
  const s = el && el.dataset.status;
  if (window.__perf.tEnd == null && s && s !== "streaming") window.__perf.tEnd = performance.now();
}).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-status"] });
"""

# The renderer's own share: MessageView.renderNow timed by wrapping it (the page's module: same URL,
# same instance), so the figures can be told apart from what the machine's load adds to them.
SEND_JS = """
async () => {
  const { MessageView } = await import("/static/js/message-view.js");
  const renderNow = MessageView.prototype.renderNow;
  window.__perf.renders = [];
  MessageView.prototype.renderNow = function (...args) {
    const t = performance.now();
    try {
      return renderNow.apply(this, args);
    } finally {
      if (this.role === "assistant") window.__perf.renders.push(performance.now() - t);
    }
  };
  window.__perf.t0 = performance.now();
  document.querySelector("#send").click();
}
"""

# The figures, over [press of Send, end on screen].
FIGURES_JS = """
() => {
  const p = window.__perf;
  const inRun = (t) => t >= p.t0 && t <= p.tEnd;
  const frames = p.frames.filter(inRun);
  let gap = 0;
  for (let i = 1; i < frames.length; i++) gap = Math.max(gap, frames[i] - frames[i - 1]);
  const tasks = p.longtasks.filter(([start, dur]) => start + dur >= p.t0 && start <= p.tEnd);
  const durations = tasks.map(([, d]) => d);
  const seconds = (p.tEnd - p.t0) / 1000;
  const el = document.querySelector("article[data-role=assistant]");
  const r = [...p.renders].sort((a, b) => a - b);
  return {
    renders: r.length,
    renderMean: r.reduce((a, b) => a + b, 0) / Math.max(1, r.length),
    renderP99: r.length ? r[Math.min(r.length - 1, Math.floor(r.length * 0.99))] : 0,
    renderMax: r.length ? r[r.length - 1] : 0,
    renderTotal: r.reduce((a, b) => a + b, 0),
    status: el.dataset.status,
    chars: el._view.reply.text.length,
    seconds,
    fps: frames.length / seconds,
    maxFrameGap: gap,
    longTasks: tasks.length,
    longMax: durations.length ? Math.max(...durations) : 0,
    longTotal: durations.reduce((a, b) => a + b, 0),
  };
}
"""

MATCHES_JS = """
async () => {
  const { renderMarkdown } = await import("/static/js/markdown.js");
  const el = document.querySelector("article[data-role=assistant]");
  const shown = el.querySelector("[data-testid=message-text]").cloneNode(true);
  for (const b of shown.querySelectorAll("button.code-copy")) b.remove();
  for (const pre of shown.querySelectorAll("pre[data-lang]")) pre.removeAttribute("data-lang");
  const expected = document.createElement("div");
  expected.append(renderMarkdown(el._view.reply.text));
  return shown.innerHTML === expected.innerHTML;
}
"""


def baseline_scripts(rev: str) -> dict[str, bytes]:
    """static/js/** at `rev`, by URL path."""
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "static/js"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        "/" + name: subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        for name in names
    }


def run_once(browser: Any, base: str, content: str, transport: str, scripts: dict | None) -> dict:
    context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 900})
    try:
        if scripts is not None:

            def serve(route: Route) -> None:
                path = "/" + route.request.url.split("/", 3)[3].split("?")[0]
                body = scripts.get(path)
                if body is None:
                    route.continue_()
                else:
                    route.fulfill(body=body, content_type="text/javascript")

            context.route("**/static/js/**", serve)
        context.add_init_script(
            f"localStorage.setItem('streamchat.transport', '{transport}');" + PROBE_JS
        )
        page = context.new_page()
        page.goto("/healthz")
        csrf = {c["name"]: c["value"] for c in context.cookies()}.get("csrftoken", "")
        email = f"bench-{os.urandom(6).hex()}@example.com"
        r = context.request.post(
            "/api/auth/signup",
            data={"email": email, "password": PASSWORD},
            headers={"x-csrftoken": csrf},
        )
        assert r.status == 201, r.text()
        page.goto("/")
        page.fill("#composer", content)
        page.evaluate(SEND_JS)
        page.wait_for_function("() => window.__perf.tEnd != null", timeout=900_000, polling=500)
        figures = page.evaluate(FIGURES_JS)
        figures["matches"] = page.evaluate(MATCHES_JS)
        return figures
    finally:
        context.close()


def row(label: str, runs: list[dict]) -> str:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return (
        f"| {label} | {len(runs)} | {med('renders'):.0f} | {med('renderMean'):.2f} | "
        f"{med('renderP99'):.1f} | {med('renderMax'):.0f} | {med('renderTotal') / 1000:.1f} | "
        f"{med('fps'):.1f} | {med('maxFrameGap'):.0f} | "
        f"{med('longTasks'):.0f} | {med('longMax'):.0f} | {med('longTotal'):.0f} | "
        f"{med('seconds'):.1f} | {min(r['chars'] for r in runs):,} | "
        f"{'yes' if all(r['matches'] for r in runs) else 'NO'} | "
        f"{'/'.join(sorted({r['status'] for r in runs}))} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2, help="runs per configuration (interleaved)")
    ap.add_argument("--step-ms", type=float, default=2.0, help="synthetic engine step (one token)")
    ap.add_argument("--transport", choices=("sse", "ws"), default="sse")
    ap.add_argument("--kinds", default="plain,markdown")
    ap.add_argument("--baseline-rev", help="also run the page's scripts of this git revision")
    args = ap.parse_args(argv)

    kinds = args.kinds.split(",")
    codes: list[tuple[str, dict | None]] = [("this tree", None)]
    if args.baseline_rev:
        codes.insert(0, (f"baseline {args.baseline_rev}", baseline_scripts(args.baseline_rev)))
    work = Path(tempfile.mkdtemp(prefix="long-reply-"))
    env = {
        "SECRET_KEY": "bench",
        "ENGINE": "synthetic",
        "DATA_DIR": str(work),
        "DATABASE_URL": f"sqlite+aiosqlite:///{work / 'bench.db'}",
        "ENGINE_CONTEXT": str(args.tokens + 1024),
        "ENGINE_KV_CELLS": str(2 * (args.tokens + 1024)),
        "DEFAULT_MAX_TOKENS": str(args.tokens),
        "SYNTHETIC_STEP_MS": str(args.step_ms),
        "SYNTHETIC_PER_SEQ_MS": "0",
    }
    print(
        f"{args.tokens:,}-token replies, synthetic engine step {args.step_ms} ms "
        f"(~{1000 / args.step_ms:.0f} tokens/s), {args.transport.upper()}, Chromium "
        f"{CHROMIUM}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"runs interleaved; figures are medians over {args.runs} runs"
    )
    server = LiveServer(env, work / "server.log", ready_timeout_s=120.0, name="bench server")
    server.start()
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM)
            try:
                for round_ in range(args.runs):
                    for kind in kinds:
                        marker = "[[synthetic:markdown]] " if kind == "markdown" else ""
                        content = f"long reply {marker}[[synthetic:tokens={args.tokens}]]"
                        # A B, then B A: neither always runs second (after the other's cleanup).
                        for label, scripts in codes if round_ % 2 == 0 else codes[::-1]:
                            fig = run_once(browser, server.url, content, args.transport, scripts)
                            results.setdefault((kind, label), []).append(fig)
                            print(
                                f"  {kind:8} {label:20} renders {fig['renders']} mean "
                                f"{fig['renderMean']:.2f} ms max {fig['renderMax']:.0f} ms; "
                                f"{fig['fps']:5.1f} fps, "
                                f"{fig['longTasks']} long tasks (max {fig['longMax']:.0f} ms, "
                                f"total {fig['longTotal']:.0f} ms), {fig['seconds']:.1f} s",
                                flush=True,
                            )
            finally:
                browser.close()
    finally:
        server.stop()
    print(
        "\n| reply | runs | renders | render mean ms | p99 ms | max ms | render total s | "
        "frames/s | longest frame gap ms | long tasks | longest ms | long-task total ms | "
        "time to final s | chars | DOM = full render | status |"
    )
    print("|---" * 16 + "|")
    for (kind, label), runs in results.items():
        print(row(f"{kind}, {label}", runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
