"""The layers import one way only (README, "Layout"): web on top of the domain, the domain on top of
the streaming core, the engine and the database layer, which know nothing of what is above them."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every `app.*` module each file of `app/<package>` imports (module-level or not)."""
    found: dict[str, set[str]] = {}
    for path in sorted((APP / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(APP.parent))] = {n for n in names if n.startswith("app.")}
    return found


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path} imports {name}"
        for path, names in imported_modules(package).items()
        for name in sorted(names)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def test_only_the_web_layer_imports_the_web_layer() -> None:
    for package in ("domain", "streaming", "engine", "db"):
        assert offenders(package, ("app.web",)) == []


def test_the_streaming_core_the_engine_and_the_database_layer_know_nothing_of_the_domain() -> None:
    for package in ("streaming", "engine", "db"):
        assert offenders(package, ("app.domain",)) == []


def test_the_scan_sees_imports() -> None:
    """The checks above are not vacuous: the web layer's own imports are found."""
    assert offenders("web", ("app.domain",)) != []
