"""The layers import one way only (README, "Layout"): web on top of the domain, the domain on top of
the streaming core, the engine and the database layer, which know nothing of what is above them.
Transports (the page's SSE routes, the WebSocket, `/v1`) sit side by side over one reply service:
none imports another, and only the app factory imports a module of routes."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"


ROUTE_DECORATORS = {"Controller", "Router", "get", "post", "put", "patch", "delete", "websocket"}
TRANSPORTS = {
    "the page's SSE routes": (
        "app.domain.chat.conversations.controllers",
    ),  # app.domain.sse: shared by /v1
    "the WebSocket": ("app.domain.chat.websocket.routes", "app.domain.chat.websocket.frames"),
    "/v1": ("app.domain.openai",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> dict[str, set[str]]:
    """What one file imports (module-level or not): module -> the names it takes from it."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.setdefault(node.module, set()).update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, set())
    return found


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every `app.*` module each file of `app/<package>` imports (module-level or not)."""
    return {
        str(path.relative_to(APP.parent)): {n for n in imports_of(path) if n.startswith("app.")}
        for path in sorted((APP / package).rglob("*.py"))
    }


def every_module() -> dict[str, set[str]]:
    """Each module under app/, by name, with the `app.*` modules it imports."""
    return {
        module_name(path): {name for name in imports_of(path) if name.startswith("app.")}
        for path in sorted(APP.rglob("*.py"))
    }


def route_modules() -> set[str]:
    """The modules that declare routes (Litestar's controllers, routers or route decorators)."""
    return {
        module_name(path)
        for path in APP.rglob("*.py")
        if imports_of(path).get("litestar", set()) & ROUTE_DECORATORS
    }


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


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


def test_only_the_app_factory_imports_modules_of_routes() -> None:
    routes = route_modules()
    assert {
        "app.domain.chat.conversations.controllers",
        "app.domain.chat.websocket.routes",
    } <= routes  # not vacuous
    assert "app.domain.openai.controllers" in routes
    importers = [
        f"{module} imports {name}"
        for module, names in every_module().items()
        for name in sorted(names & routes)
        if module != "app.web.app"
    ]
    assert importers == []


def test_transports_do_not_import_one_another() -> None:
    modules = every_module()
    for transport, own in TRANSPORTS.items():
        others = tuple(p for t, prefixes in TRANSPORTS.items() if t != transport for p in prefixes)
        assert any(within(m, own) for m in modules), transport  # the prefixes name real modules
        crossings = [
            f"{module} imports {name}"
            for module, names in modules.items()
            if within(module, own)
            for name in sorted(names)
            if within(name, others)
        ]
        assert crossings == [], transport


def test_the_reply_service_knows_no_web_framework() -> None:
    """ReplyService and every app module it imports, however deep, raise domain errors only:
    none imports Litestar (the transports translate)."""
    modules = every_module()
    paths = {module_name(path): path for path in APP.rglob("*.py")}
    pending, seen = ["app.domain.chat.replies.service"], set()
    while pending:
        module = pending.pop()
        if module in seen or module not in paths:
            continue
        seen.add(module)
        assert not any(within(n, ("litestar",)) for n in imports_of(paths[module])), module
        pending.extend(modules[module])
    assert {"app.domain.chat.replies.service", "app.domain.chat.replies.limits"} <= seen
