"""Issue checks 4-6 against the real stack (Triton, gunicorn, NGINX), through port 8080:

4. a list of 8 images is served in at most ceil(8 / max_batch_size) Triton executions;
5. a 20,000 x 20,000 PNG of a few KB is refused with a 400 in under 1 s, the router's workers
   growing by less than 50 MB;
6. a fourth model added as "Adding a model" (docs/models.md) shows (its ONNX file, model.toml and
   labels, then the build script) is served, and answers as ONNX Runtime does on torchvision's
   preprocessing of the same image.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import requests
from PIL import Image

from app.core.settings import PROJECT_ROOT
from scripts.devtools import rss_kib
from tests.references import darknet_photos, skimage_photos
from tests.support import b64

pytestmark = pytest.mark.integration

MB = 2**20


def triton_get(stack, path: str) -> dict:
    response = requests.get(f"http://127.0.0.1:{stack.triton_ports[0]}/v2/models/{path}", timeout=10)
    response.raise_for_status()
    return response.json()


def executions(stack, model: str) -> tuple[int, int]:
    """Triton's (execution_count, inference_count) of a model so far."""
    stats = triton_get(stack, f"{model}/stats")["model_stats"][0]
    return int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0))


def eight_photos() -> list[bytes]:
    photos = list(darknet_photos().values())
    photos += [jpeg(png) for png in list(skimage_photos().values())[:2]]
    return photos[:8]


def jpeg(data: bytes, max_side: int | None = None) -> bytes:
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if max_side:
        image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


# ---- check 4: a list goes to Triton in batches ---------------------------------------------------


@pytest.mark.parametrize("model, count", [("resnet", 8), ("yolov5", 8), ("resnet", 17)])
def test_a_list_is_served_in_few_triton_executions(stack, model, count):
    photos = eight_photos()
    if count > len(photos):  # smaller copies, to stay under the 6 MiB body limit
        photos = [jpeg(photo, max_side=400) for photo in photos]
    images = [b64(photos[i % len(photos)]) for i in range(count)]
    max_batch_size = int(triton_get(stack, f"{model}/config")["max_batch_size"])
    bound = math.ceil(count / max_batch_size)
    before = executions(stack, model)
    response = requests.post(
        f"{stack.url}/invocations", timeout=120, json={"modelname": model, "payload": {"img": images}}
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["result"]) == count
    # Triton records an execution's statistics just after its responses are sent: let them land.
    deadline = time.monotonic() + 5
    while (after := executions(stack, model))[1] - before[1] < count and time.monotonic() < deadline:
        time.sleep(0.05)
    ran, inferred = after[0] - before[0], after[1] - before[1]
    print(
        f"{model}: {count} images -> {ran} Triton execution(s) ({inferred} inferences; "
        f"max_batch_size {max_batch_size}, bound ceil({count}/{max_batch_size}) = {bound})"
    )
    assert inferred == count
    assert ran <= bound


# ---- check 5: a pixel bomb is refused from its header ---------------------------------------------


def png_bomb(width: int, height: int, rows: int = 100) -> bytes:
    """A valid PNG header claiming width x height RGB, with the first ``rows`` rows of zeros
    compressed (about 6 KB for 100 rows of 20,000 pixels): a few KB on the wire, 1.2 GB decoded."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(b"\x00" * (3 * width + 1) * rows, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def test_a_huge_png_is_refused_fast_and_without_memory(stack):
    bomb = png_bomb(20_000, 20_000, rows=100)
    assert 1024 < len(bomb) < 16 * 1024
    assert struct.unpack(">II", bomb[16:24]) == (20_000, 20_000)  # IHDR width, height
    workers = stack.pids()["router"]
    assert workers
    before = {pid: rss_kib(pid) for pid in workers}
    timings = []
    for attempt in range(2 * len(workers)):  # every worker gets a few, whichever takes them
        started = time.monotonic()
        if attempt % 2:
            response = requests.post(
                f"{stack.url}/invocations",
                timeout=10,
                data=bomb,
                headers={"Content-Type": "image/png", "X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet"},
            )
        else:
            response = requests.post(
                f"{stack.url}/invocations", timeout=10, json={"modelname": "yolov5", "payload": {"img": b64(bomb)}}
            )
        timings.append(time.monotonic() - started)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_input" and "20000x20000" in error["message"]
    growth = {pid: (rss_kib(pid) - kb) / 1024 for pid, kb in before.items()}
    print(
        f"PNG of {len(bomb)} bytes claiming 20000x20000: {len(timings)} requests, slowest "
        f"{max(timings) * 1000:.1f} ms; router RSS growth per process (MB): "
        + ", ".join(f"{pid}: {mb:+.1f}" for pid, mb in growth.items())
    )
    assert max(timings) < 1.0
    assert max(growth.values()) < 50


# ---- check 6: a fourth model, added as docs/models.md shows ---------------------------------------


def readme_example() -> tuple[str, str]:
    """The "Adding a model" shell block of docs/models.md: (steps 1-3, the step-4 build command)."""
    text = (PROJECT_ROOT / "docs" / "models.md").read_text()
    section = text[text.index("\n## Adding a model\n") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    setup, _, rest = block.partition("# 4.")
    build = next(line for line in rest.splitlines() if "-m scripts.model_prep" in line)
    return setup, build


@pytest.fixture(scope="module")
def fourth_model(repository, tmp_path_factory):
    """A copy of the test repository (hard links) as ``<tmp>/models``, with the documented squeezenet
    example added by running the documented commands in ``<tmp>``, then built."""
    work = tmp_path_factory.mktemp("adding-a-model")
    shutil.copytree(repository, work / "models", copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    setup, build = readme_example()
    python = sys.executable
    subprocess.run(["bash", "-euo", "pipefail", "-c", setup.replace(".venv/bin/python", python)], cwd=work, check=True)
    command = build.replace(".venv/bin/python", python).replace(
        "-m scripts.model_prep", f"-m scripts.model_prep --source {work / 'models'}"
    )
    done = subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, text=True)
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return work / "models" / "squeezenet"


def test_the_build_took_the_users_onnx(fourth_model):
    source = json.loads((fourth_model / "source.json").read_text())
    assert source["weights"] == "file" and source["onnx"] == "model.onnx" and source["builder"] is None
    assert (fourth_model / "1" / "model.onnx").read_bytes() == (fourth_model / "model.onnx").read_bytes()
    assert (fourth_model / "1" / "model.py").is_file()
    assert 'string_value: "file"' in (fourth_model / "config.pbtxt").read_text()


# Tolerance: our input and torchvision's may differ by one float32 rounding (we tabulate
# v * (1/127.5) - 1 in float64 and round once; torchvision computes (v / 255 - 0.5) / 0.5 in
# float32), about 1e-7 of the input. The untrained network's probabilities are all close to
# 1/1000, so they are compared relatively: within 1e-4 of their value. The test also shows that
# this tolerance tells preprocessings apart (ImageNet's mean/std instead of scale/offset fails it).
SCORE_RTOL = 1e-4
MEAN_STD = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def reference_top(session, data: bytes, k: int, normalize=([0.5] * 3, [0.5] * 3)) -> list[tuple[int, float]]:
    from torchvision import transforms

    reference = transforms.Compose(
        [
            transforms.Resize(182),
            transforms.CenterCrop(160),
            transforms.ToTensor(),
            transforms.Normalize(*normalize),  # the default: v / 127.5 - 1 on 0..255 values
        ]
    )
    tensor = reference(Image.open(io.BytesIO(data)).convert("RGB")).numpy()[None]
    (logits,) = session.run(None, {"input": tensor})
    logits = logits[0].astype(np.float64)
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    top = np.argsort(-probabilities, kind="stable")[:k]
    return [(int(i), float(probabilities[i])) for i in top]


def test_the_fourth_model_is_served_as_onnx_runtime_answers(fourth_model, new_stack):
    import onnxruntime as ort

    stack = new_stack(fourth_model.parent)
    print(f"stack with 4 models healthy after {stack.wait_healthy(timeout=240):.1f} s")
    ping = stack.ping().json()
    assert ping["models"].get("squeezenet") == "READY", ping
    labels = (fourth_model / "labels.txt").read_text().splitlines()
    session = ort.InferenceSession(str(fourth_model / "model.onnx"), providers=["CPUExecutionProvider"])
    photos = {
        **{k: v for k, v in darknet_photos().items() if k in ("dog.jpg", "horses.jpg", "person.jpg")},
        **{k: v for k, v in skimage_photos().items() if k in ("astronaut.png", "camera-grey.png")},
    }
    wrong_diffs = []
    for name, data in photos.items():
        expected = reference_top(session, data, 5)
        raw = requests.post(
            f"{stack.url}/invocations",
            data=data,
            timeout=60,
            headers={
                "Content-Type": "image/png" if name.endswith(".png") else "image/jpeg",
                "X-Amzn-SageMaker-Custom-Attributes": "modelname=squeezenet",
            },
        )
        assert raw.status_code == 200, raw.text
        envelope = requests.post(
            f"{stack.url}/invocations",
            timeout=60,
            json={"modelname": "squeezenet", "payload": {"img": b64(data), "topk": 3}},
        )
        assert envelope.status_code == 200, envelope.text
        assert envelope.json()["modelname"] == "squeezenet"
        served = raw.json()["result"]  # topk 5: the model.toml's default
        assert envelope.json()["result"] == served[:3]
        assert [c["index"] for c in served] == [i for i, _ in expected], name
        assert [c["label"] for c in served] == [labels[i] for i, _ in expected], name
        diff = max(abs(c["score"] - score) / score for c, (_, score) in zip(served, expected))
        wrong = reference_top(session, data, 5, normalize=MEAN_STD)
        wrong_diff = max(abs(c["score"] - score) / score for c, (_, score) in zip(served, wrong))
        print(
            f"{name}: served top-5 {[(c['index'], round(c['score'], 7)) for c in served]}; ONNX Runtime on "
            f"torchvision's preprocessing: same indices and labels, max relative score diff {diff:.1e} "
            f"(with ImageNet mean/std instead: {wrong_diff:.1e})"
        )
        assert diff <= SCORE_RTOL, name
        wrong_diffs.append(wrong_diff)
    assert max(wrong_diffs) > SCORE_RTOL, "the tolerance must tell a wrong normalisation apart"
