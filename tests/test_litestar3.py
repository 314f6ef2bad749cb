"""Ready for Litestar 3: every handler and provider declares its dependencies, path and query
parameters and body explicitly (`NamedDependency`, `FromPath`, `QueryParameter`, `JSONBody`...), as
Litestar 3 reads them; Litestar 2.23+ warns of each one it had to infer
(litestar/_kwargs/kwargs_model.py), and pyproject's `filterwarnings` makes any such warning an
error in every test."""

from __future__ import annotations

import warnings
from pathlib import Path

from app.settings import EngineSettings, Settings
from app.web.app import create_app


def test_building_the_app_warns_of_nothing_that_litestar_3_drops(tmp_path: Path) -> None:
    settings = Settings(
        engine=EngineSettings(kind="synthetic"),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        create_app(settings)
    # Deprecations of every kind: Litestar's own, and the plain DeprecationWarning of
    # `Parameter(query=...)` (litestar/params.py).
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == []
