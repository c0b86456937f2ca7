"""Settings: each default is written once, in the dataclass, and ``from_env`` agrees with it."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import pytest

from app.core import settings as settings_module
from app.core.settings import ENV_FIELDS, Settings


def test_from_an_empty_environment_every_field_is_the_dataclass_default():
    from_env, default = Settings.from_env({}), Settings()
    for field in fields(Settings):
        assert getattr(from_env, field.name) == getattr(default, field.name), field.name
    assert from_env.workers == default.workers == (os.cpu_count() or 1)


def test_every_variable_names_a_field_and_lives_in_the_settings_module():
    names = {field.name for field in fields(Settings)}
    assert set(ENV_FIELDS) <= names
    constants = {value for key, value in vars(settings_module).items() if key.isupper() and isinstance(value, str)}
    assert {variable for variable, _ in ENV_FIELDS.values()} <= constants


def test_set_variables_override_and_blank_ones_keep_the_default():
    env = {
        settings_module.WORKERS: "3",
        settings_module.SERVER_TIMEOUT: "5",
        settings_module.LOG_LEVEL: " debug ",
        settings_module.MODEL_REPOSITORY: "/somewhere",
        settings_module.SAFE_PORT_RANGE: "9000-9010",
        settings_module.ROUTER_THREADS: "  ",
    }
    got = Settings.from_env(env)
    assert (got.workers, got.server_timeout_s, got.log_level) == (3, 5.0, "DEBUG")
    assert (got.model_repository, got.triton_grpc_url, got.threads) == (Path("/somewhere"), "127.0.0.1:9001", 16)
    assert Settings.from_env({**env, settings_module.TRITON_GRPC_URL: "triton:8001"}).triton_grpc_url == "triton:8001"


@pytest.mark.parametrize(
    "variable, value, message",
    [
        (settings_module.WORKERS, "0", "MODEL_SERVER_WORKERS=0 is below its minimum 1"),
        (settings_module.WORKERS, "two", "MODEL_SERVER_WORKERS='two' is not an integer"),
        (settings_module.TRITON_TIMEOUT, "-1", "TRITON_TIMEOUT_S=-1.0 must be positive"),
        (settings_module.TRITON_TIMEOUT, "soon", "TRITON_TIMEOUT_S='soon' is not a number"),
    ],
)
def test_a_bad_value_is_named_with_its_variable(variable, value, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env({variable: value})
