"""The grounded_segmentation family through the whole stack (NGINX, gunicorn, the router, a real Triton
running app/triton/grounded_model.py): a repository holding a tiny Grounding DINO and a tiny SAM (the
"zsd" and "sam" small-model sets, as their preparation wrote them) and a chain naming the two, served
from a copy. Against the two references run one after the other (tests/grounded_reference.py: the
detector's, then SAM's with the detector's boxes); both request forms; JSON Lines; callers at once,
each with an image of its own; bad input (400s naming the field; the endpoint keeps serving); /ping
and the OpenAPI contract. And on a multi-model endpoint: the repository packaged as ``package-models
--per-model`` packages it, each archive extracted where SageMaker puts it; the detector's, SAM's and the
chain's (which carries its two models) loaded, invoked by TargetModel and unloaded, the Detections and
Masks metric filters applied to the access lines they wrote. Tolerances: the references' (labels exact, scores 1e-4, boxes 0.05 pixel;
masks: at most 0.1 % of the pixels differ, where the reference's logit is within 1e-4 of the
threshold)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from PIL import Image

from scripts.devtools import Stack
from scripts.model_prep import cli as prepare_models
from scripts.model_prep.small_models.sets import Built
from scripts.sagemaker import package_models
from scripts.sagemaker.filter_pattern import publish
from scripts.sagemaker.model_metrics import MULTI_MODEL, metric_filters
from tests.grounded_reference import check_against_references
from tests.sam_reference import SamReference, assert_answers
from tests.support import ONE_INSTANCE, access_lines, assert_conforms, assert_error, b64, block_photo, post
from tests.zsd_reference import ZsdReference, assert_answer

pytestmark = pytest.mark.integration

CHAIN = "gdino_sam"
PARTS = {"gdino_tiny": "zsd", "sam_tiny": "sam"}  # each model as its set prepared it, by name
LABELS = ["a cat", "a remote control"]
THRESHOLD = 0.6  # the tiny random detector's scores spread over about 0.3 to 0.7
ENDPOINT = "prompted"  # the multi-model endpoint's name, on its access lines


@pytest.fixture(scope="module")
def references(small_models: Built) -> dict:
    return {
        "gdino": ZsdReference(small_models.models("zsd") / "gdino_tiny" / "hf"),
        "sam": SamReference(small_models.models("sam") / "sam_tiny" / "hf"),
    }


@pytest.fixture(scope="module")
def repository(small_models: Built, tmp_path_factory) -> Path:
    """The two models as their sets prepared them, and the chain naming them, prepared in place."""
    repository = tmp_path_factory.mktemp("grounded-repository")
    for name, set_name in PARTS.items():
        shutil.copytree(small_models.repository(set_name) / name, repository / name)
    (repository / CHAIN).mkdir()
    (repository / CHAIN / "model.toml").write_text(
        'family = "grounded_segmentation"\ndetector = "gdino_tiny"\nsegmenter = "sam_tiny"\n'
    )
    # the chain prepared in place (its config.pbtxt and model.py; it opens its two models' graphs)
    assert prepare_models.main(["--source", str(repository), "--models", CHAIN]) == 0
    return repository


@pytest.fixture(scope="module")
def chain_stack(repository: Path, tmp_path_factory, stopping: list[Stack]):
    started = Stack(repository, env_extra=ONE_INSTANCE).start(tmp_path_factory.mktemp("grounded-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


def result(stack: Stack, payload: dict):
    r = post(stack, {"modelname": CHAIN, "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


def test_ping_names_the_chain_and_its_models_ready(chain_stack):
    r = requests.get(f"{chain_stack.url}/ping", timeout=10)
    assert r.status_code == 200
    assert all(f'"{name}"' in r.text for name in (CHAIN, *PARTS)), r.text


def test_each_detection_with_its_mask_equals_the_two_references(chain_stack, references):
    image = block_photo(150, 100, 0)
    answer = result(chain_stack, {"img": b64(image), "labels": LABELS, "threshold": THRESHOLD})
    assert answer and set(answer[0]) == {"label", "score", "box", "mask", "mask_score"}
    check_against_references(answer, references, "gdino", image, LABELS, threshold=THRESHOLD)
    prompt = "a cat. a remote control."  # a raw body: the prompt and thresholds in the custom attributes
    r = post(chain_stack, image, "image/png", f"modelname={CHAIN},text={prompt},threshold=0.65,mask_threshold=0.5")
    assert r.status_code == 200, r.text[:500]
    check_against_references(r.json()["result"], references, "gdino", image, prompt, threshold=0.65, mask_threshold=0.5)


def test_json_lines_and_callers_at_once_are_each_answered_their_own(chain_stack, references):
    images = [block_photo(120 + 15 * i, 90 + 10 * i, 20 + i) for i in range(4)]
    payloads = [{"img": b64(image), "labels": LABELS, "threshold": THRESHOLD} for image in images]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda payload: result(chain_stack, payload), payloads))
    for answer, image in zip(answers, images):
        check_against_references(answer, references, "gdino", image, LABELS, threshold=THRESHOLD)
    lines = "\n".join(json.dumps({"modelname": CHAIN, "payload": payload}) for payload in payloads[:2])
    r = post(chain_stack, lines, "application/jsonlines")
    assert r.status_code == 200, r.text[:300]
    for line, image in zip(r.text.splitlines(), images):
        check_against_references(json.loads(line)["result"], references, "gdino", image, LABELS, threshold=THRESHOLD)


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({}, "payload.labels"),
        ({"labels": []}, "payload.labels"),
        ({"labels": LABELS, "threshold": 2}, "payload.threshold"),
        ({"labels": LABELS, "multimask_output": True}, "payload.multimask_output"),
        ({"labels": ["a.b"]}, "payload.labels[0]"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_the_endpoint_keeps_serving(chain_stack, references, payload, named):
    image = block_photo(150, 100, 0)
    r = post(chain_stack, {"modelname": CHAIN, "payload": {"img": b64(image), **payload}})
    assert_error(r, 400, "invalid_input", named)
    assert_conforms(r, "/invocations", "POST")
    assert chain_stack.ping().status_code == 200
    answer = result(chain_stack, {"img": b64(image), "labels": LABELS, "threshold": THRESHOLD})
    check_against_references(answer, references, "gdino", image, LABELS, threshold=THRESHOLD)


def extracted_archives(repository: Path, root: Path) -> dict[str, tuple[set[str], Path]]:
    """Each model's archive as ``package-models --per-model`` writes it: its members, and the folder
    it is extracted to as SageMaker extracts it (``<root>/<name>/model``)."""
    files = package_models.validate(repository)
    archives = package_models.write_per_model(repository, package_models.per_model(repository, files), root, log=str)
    made = {}
    for archive in archives:
        name = archive.name.removesuffix(".tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(root / name / "model", filter="data")
            made[name] = {m.split("/")[0] for m in tar.getnames()}, root / name / "model"
    return made


def invoke(mme: Stack, name: str, payload: dict, request_id: str = "") -> requests.Response:
    """SageMaker's invocation of a loaded model: its name in the path, the archive in TargetModel."""
    headers = {"X-Amzn-SageMaker-Target-Model": f"{name}.tar.gz", "X-Request-Id": request_id or name}
    return requests.post(f"{mme.url}/models/{name}/invoke", json={"payload": payload}, headers=headers, timeout=60)


def published(mme: Stack, request_ids: set[str]) -> dict[str, dict[str, float]]:
    """What the Detections and Masks filters deploy makes publish from each request's access line, by
    request id (each the name of the model it invoked, whose archive is the Model dimension)."""
    filters = {f["metricTransformations"][0]["metricName"]: f for f in metric_filters(ENDPOINT, MULTI_MODEL)}
    found: dict[str, dict[str, float]] = {}
    for rid, raw in access_lines(mme, request_ids).items():
        for metric in ("Detections", "Masks"):
            for one in publish(filters[metric], raw):
                assert one.dimensions == {"EndpointName": ENDPOINT, "Model": f"{rid}.tar.gz"}, one
                found.setdefault(rid, {})[metric] = one.value
    return found


def test_the_detector_sam_and_the_chain_load_answer_and_unload_on_a_multi_model_endpoint(
    repository, references, tmp_path_factory, stopping
):
    """Each archive loaded, invoked and unloaded; the chain's answer the two references'; the per-model
    Detections and Masks metrics published from the access lines as CloudWatch would."""
    archives = extracted_archives(repository, tmp_path_factory.mktemp("opt-ml-models"))
    assert {name: members for name, (members, _) in archives.items()} == {
        CHAIN: {CHAIN, *PARTS},  # the chain carries its two models
        "gdino_tiny": {"gdino_tiny"},
        "sam_tiny": {"sam_tiny"},
    }
    logs = tmp_path_factory.mktemp("grounded-mme-logs")
    state = logs / "state"
    env = {"SAGEMAKER_MULTI_MODEL": "true", "MULTI_MODEL_DIR": str(state), "ENDPOINT_NAME": ENDPOINT, **ONE_INSTANCE}
    mme = Stack(logs, env_extra=env).start(logs)
    stopping.append(mme)
    mme.wait_healthy()
    image = block_photo(150, 100, 0)
    pixels = Image.open(io.BytesIO(image)).convert("RGB")
    boxes = [[10, 20, 120, 90], [40, 5, 140, 60]]
    try:
        for name, (_, url) in archives.items():
            r = requests.post(f"{mme.url}/models", json={"model_name": name, "url": str(url)}, timeout=120)
            assert r.status_code == 200, r.text
        chained = invoke(mme, CHAIN, {"img": b64(image), "labels": LABELS, "threshold": THRESHOLD})
        assert chained.status_code == 200, chained.text[:500]
        check_against_references(chained.json()["result"], references, "gdino", image, LABELS, threshold=THRESHOLD)
        detected = invoke(mme, "gdino_tiny", {"img": b64(image), "labels": LABELS, "threshold": THRESHOLD})
        assert detected.status_code == 200, detected.text[:500]
        assert_answer(detected.json()["result"], references["gdino"].detect(pixels, LABELS, threshold=THRESHOLD))
        masks = invoke(mme, "sam_tiny", {"img": b64(image), "boxes": boxes})
        assert masks.status_code == 200, masks.text[:500]
        assert_answers(masks.json()["result"], references["sam"].prompts(pixels, boxes=boxes), False)
        found = len(chained.json()["result"])
        assert published(mme, {CHAIN, *PARTS}) == {
            CHAIN: {"Detections": found, "Masks": found},
            "gdino_tiny": {"Detections": len(detected.json()["result"])},
            "sam_tiny": {"Masks": len(boxes)},
        }
        metrics = requests.get(f"{mme.url}/metrics", timeout=30).text
        assert f'router_masks_total{{model="{CHAIN}"}} {float(found)}' in metrics, metrics
        for name in archives:
            assert requests.delete(f"{mme.url}/models/{name}", timeout=60).status_code == 200
        gone = invoke(mme, CHAIN, {"img": b64(image), "labels": LABELS})
        assert gone.status_code == 404, gone.text
        assert not list((state / "repository").iterdir())  # the chain's models' links went with it
    finally:
        mme.begin_stop()
