"""python -m scripts.caller invoke --endpoint-url <the running stack> prints a result for each model,
and the container's own JSON error when a call fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from app.core.settings import PROJECT_ROOT

pytestmark = pytest.mark.integration

COMMAND = ("-m", "scripts.caller", "invoke")


@pytest.fixture(scope="module")
def sample_image(tmp_path_factory) -> Path:
    shipped = PROJECT_ROOT / "build" / "samples" / "dog.jpg"
    if shipped.is_file():
        return shipped
    path = tmp_path_factory.mktemp("samples") / "gradient.jpg"
    Image.radial_gradient("L").convert("RGB").resize((320, 240)).save(path, "JPEG")
    return path


def run_invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *COMMAND, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )


def test_prints_a_result_for_each_model(stack, sample_image):
    result = run_invoke("--endpoint-url", stack.url, "--image", str(sample_image))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for model in ("resnet", "yolov5", "bert_base"):
        assert f"{model} (version 1):" in out
    resnet = out.split("resnet (version 1):")[1].split("yolov5")[0]
    assert resnet.count("(index ") == 3  # topk 3 by default: label (index N) score
    assert "detections in " in out
    assert "the capital of france is" in out  # fill-mask: candidate sequences


def test_model_file_pairs_and_options(stack, sample_image, tmp_path):
    sentence = tmp_path / "sentence.txt"
    sentence.write_text("The world has [MASK] people.")
    result = run_invoke(
        "--endpoint-url", stack.url, "--option", "topk=2", f"resnet={sample_image}", f"bert_base={sentence}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    resnet, bert = result.stdout.split("bert_base (version 1):")
    assert resnet.count("(index ") == 2
    assert len([line for line in bert.splitlines() if line.strip()]) == 2


def test_a_failed_call_shows_the_containers_json_error(stack, tmp_path):
    sentence = tmp_path / "sentence.txt"
    sentence.write_text("not an image")
    result = run_invoke("--endpoint-url", stack.url, f"resnet={sentence}")
    assert result.returncode == 1
    assert "resnet: failed with status 415" in result.stdout
    assert '"code": "unsupported_media_type"' in result.stdout
