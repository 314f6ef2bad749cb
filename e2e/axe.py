"""axe-core in the page: run Deque's accessibility rules and fail on serious or critical findings.

axe-core is vendored for the tests (e2e/vendor/axe.min.js, licence beside it; version in its
header). The page's Content-Security-Policy allows only this site's scripts, so axe is not added as
a <script>: Playwright's `evaluate` runs it through the DevTools protocol, which CSP does not govern.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import Page

AXE_SOURCE = (Path(__file__).parent / "vendor" / "axe.min.js").read_text(encoding="utf-8")
BLOCKING = ("serious", "critical")

RUN_AXE = """
async (exclude) => {
  const context = exclude.length ? { include: [document], exclude: exclude.map((s) => [s]) } : document;
  const results = await axe.run(context, { resultTypes: ["violations"] });
  return results.violations.map((v) => ({
    id: v.id,
    impact: v.impact,
    help: v.help,
    nodes: v.nodes.map((n) => ({ target: n.target.join(" "), summary: n.failureSummary })),
  }));
}
"""


def axe_violations(page: Page, exclude: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every axe violation on the page as it is now (all impacts)."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(f"() => {{ {AXE_SOURCE}\n; window.axe = axe; }}")
    return page.evaluate(RUN_AXE, list(exclude))


def describe(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        lines.append(f"{v['impact']}: {v['id']} ({v['help']})")
        lines.extend(f"    {n['target']}: {n['summary']}" for n in v["nodes"][:5])
    return "\n".join(lines)


def assert_accessible(page: Page, where: str) -> list[dict[str, Any]]:
    """No serious or critical axe violation on `page`; returns the lesser ones (for the log)."""
    violations = axe_violations(page)
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    assert not blocking, f"{where}: axe found\n{describe(blocking)}"
    return violations
