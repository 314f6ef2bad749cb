"""requirements.lock pins everything pyproject.toml asks for, at versions it allows: a dependency
added or tightened in pyproject.toml without `scripts/lock` fails here, not on a fresh machine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {
        canonicalize_name(name): version
        for name, version in re.findall(r"^([A-Za-z0-9._-]+)==([^\s\\;]+)", text, re.M)
    }


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["dev"], *extras["postgres"]]]


def test_every_requirement_is_pinned_at_an_allowed_version() -> None:
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock: run scripts/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {requirement.name}=={pins[name]}, outside {requirement}:"
            " run scripts/lock"
        )


def test_every_pin_carries_hashes() -> None:
    text = (ROOT / "requirements.lock").read_text()
    pinned = re.findall(r"^[A-Za-z0-9._-]+==.*?(?=^[A-Za-z0-9._-]+==|\Z)", text, re.M | re.S)
    assert len(pinned) == len(_pins())
    for entry in pinned:
        assert "--hash=sha256:" in entry, entry.splitlines()[0]
