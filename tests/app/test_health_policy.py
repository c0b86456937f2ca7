"""/ping's health policy: required and optional models (model.toml ``required``), and the ping mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.settings import LIVE_PING, Settings
from app.core.spec import SpecError
from app.router import create_app
from clients.families import load_spec
from tests.support import make_spec_repository


@pytest.fixture(scope="module")
def optional_yolov5(tmp_path_factory):
    root = make_spec_repository(tmp_path_factory.mktemp("optional"))
    spec = root / "yolov5" / "model.toml"
    spec.write_text("required = false\n" + spec.read_text())
    return root


def ping(settings, triton):
    response = create_app(settings, triton=triton).test_client().get("/ping")
    return response.status_code, response.get_json()


def test_an_optional_model_that_is_down_is_listed_but_the_instance_stays_healthy(optional_yolov5, fake_triton_class):
    triton = fake_triton_class(optional_yolov5)
    settings = Settings(model_repository=optional_yolov5)
    for name in [n for n in triton.states if n.startswith("yolov5")]:
        triton.states[name] = "UNAVAILABLE"
    assert ping(settings, triton) == (
        200,
        {
            "status": "healthy",
            "models": {"bert_base": "READY", "resnet": "READY", "yolov5": "UNAVAILABLE"},
        },
    )
    triton.states["resnet_pipeline"] = "UNAVAILABLE"  # a required one down: unhealthy
    status, body = ping(settings, triton)
    assert status == 503 and body["models"]["resnet"] == "UNAVAILABLE" and body["status"] == "unhealthy"


def test_a_model_is_required_unless_it_says_otherwise(settings, triton):
    triton.states["yolov5_pipeline"] = "UNAVAILABLE"
    status, body = ping(settings, triton)
    assert (status, body["models"]["yolov5"]) == (503, "UNAVAILABLE")


def test_live_mode_is_healthy_while_triton_lives(settings, triton):
    live = replace(settings, ping_mode=LIVE_PING)
    for name in triton.states:
        triton.states[name] = "UNAVAILABLE"
    triton.ready = False
    status, body = ping(live, triton)
    assert status == 200 and set(body["models"].values()) == {"UNAVAILABLE"}
    triton.live = False
    assert ping(live, triton)[0] == 503


def test_the_ping_mode_setting():
    assert Settings.from_env({"SAGEMAKER_TRITON_PING_MODE": "LIVE"}).ping == "live"
    assert Settings.from_env({}).ping == "ready"
    # As in the stock image: live by default on a multi-model endpoint, unless set otherwise.
    assert Settings.from_env({"SAGEMAKER_MULTI_MODEL": "true"}).ping == "live"
    assert Settings.from_env({"SAGEMAKER_MULTI_MODEL": "TRUE", "SAGEMAKER_TRITON_PING_MODE": "ready"}).ping == "ready"
    with pytest.raises(ValueError, match="SAGEMAKER_MULTI_MODEL: expected true or false, got 'yes'"):
        Settings.from_env({"SAGEMAKER_MULTI_MODEL": "yes"})
    with pytest.raises(ValueError, match="SAGEMAKER_TRITON_PING_MODE='sometimes'"):
        Settings.from_env({"SAGEMAKER_TRITON_PING_MODE": "sometimes"})


def test_required_must_be_a_boolean(optional_yolov5, tmp_path):
    assert load_spec(optional_yolov5 / "yolov5").required is False
    assert load_spec(optional_yolov5 / "resnet").required is True
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.toml").write_text('required = "no"\n' + (optional_yolov5 / "resnet" / "model.toml").read_text())
    with pytest.raises(SpecError, match="required must be true or false"):
        load_spec(folder)
