"""Settings from the environment: each field's variable, converted and checked by msgspec."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from app.settings import EngineSettings, Settings, SettingsError

README = Path(__file__).resolve().parents[1] / "README.md"


def test_variables_are_converted_to_their_fields_types() -> None:
    settings = Settings.from_env(
        {
            "ENGINE": "synthetic",
            "ENGINE_CONTEXT": "4096",
            "ENGINE_STEP_STRETCH": "1.5",
            "TRTLLM_IN_PROCESS": "yes",
            "ENGINE_UPSTREAMS": "http://a:8000/v1/, http://b:8000/v1,",
            "COOKIE_SECURE": "TRUE",
            "KEEPALIVE_S": "2",
            "DEBUG": "0",
            "METRICS_TOKEN": "t0ken",
        }
    )
    assert settings.engine.kind == "synthetic"
    assert settings.engine.context_size == 4096
    assert settings.engine.step_stretch == 1.5
    assert settings.engine.trtllm_in_process is True
    assert settings.engine.upstreams == ("http://a:8000/v1", "http://b:8000/v1")
    assert settings.cookie_secure == "true"
    assert settings.keepalive_s == 2.0
    assert settings.debug is False
    assert settings.metrics_token == "t0ken"


def test_unset_and_empty_variables_leave_the_defaults() -> None:
    settings = Settings.from_env({"ENGINE_CONTEXT": "", "SECRET_KEY": "  ", "MODEL_PATH": ""})
    defaults = Settings()
    assert settings.engine == EngineSettings()
    assert settings.max_replies_per_user == defaults.max_replies_per_user
    assert settings.engine.model_path is None
    assert len(settings.secret_key) == 64  # a fresh random key, not ""
    assert settings.secret_key != Settings.from_env({}).secret_key


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("ENGINE_CONTEXT", "lots", "Expected `int`, got `str`"),
        ("KEEPALIVE_S", "soon", "Expected `float`, got `str`"),
        ("DEBUG", "maybe", "Expected `bool`, got `str`"),
        ("COOKIE_SECURE", "sometimes", "Invalid enum value 'sometimes'"),
        ("QUOTA_TOKENS_PER_DAY", "-5", "Expected `int` >= 0"),
        ("DATABASE_BUSY_TIMEOUT_S", "0", "Expected `float` > 0.0"),
        ("SHUTDOWN_SAVE_DEADLINE_S", "-1", "Expected `float` >= 0.0"),
    ],
)
def test_a_bad_value_names_its_variable(variable: str, value: str, problem: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({variable: value})
    assert str(raised.value) == f"{variable}: {problem}"


def test_every_setting_has_a_variable_and_the_readme_documents_it() -> None:
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", README.read_text()))
    for cls in (Settings, EngineSettings):
        for f in fields(cls):
            if f.name == "engine":
                continue
            variable = f.metadata.get("env")
            assert variable, f"{cls.__name__}.{f.name} names no environment variable"
            if not variable.startswith("SYNTHETIC_"):  # the load-test engine's knobs
                assert variable in documented, f"{variable} is not in the README's table"
