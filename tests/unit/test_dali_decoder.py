"""``[preprocess] decoder`` and the DALI step's CPU threads (scripts/model_prep/dali_pipeline.py):

- the written ``dali.py`` decodes on ``mixed`` with libjpeg's chroma upsampling for ``"exact"``
  (the default) and without it for ``"fast"``, read from the GPU graph the file defines (not built:
  no GPU here; tests/gpu/test_dali_gpu.py runs it where there is one); the CPU graph is unchanged;
- the config carries the backend's ``num_threads`` parameter (4 unless given), one GPU instance;
- a decoder the step does not know, or a misspelt key, is a SpecError naming the file and the key,
  at the router's start as in model preparation.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from tritonclient.grpc import model_config_pb2 as mc

from app.core.settings import Settings
from app.core.spec import SpecError
from clients.families import offline_client
from scripts.model_prep import dali_pipeline
from tests.dali_support import model_spec, variant
from tests.references import darknet_photos

MODELS = ["resnet", "yolov5"]


def decoder_arguments(namespace: dict, device: str) -> dict[str, str]:
    """The image decoder's arguments in the graph the ``dali.py`` namespace defines on ``device``
    (as DALI's operator spec prints them), found by walking back from the graph's outputs."""
    from nvidia.dali import Pipeline

    with Pipeline(batch_size=1, num_threads=1, device_id=0 if device == "gpu" else None):
        outputs = namespace["preprocess_graph"](namespace["PARAMS"], device)
    found, seen, stack = [], set(), list(outputs)
    while stack:
        operator = stack.pop().source
        if operator is None or id(operator) in seen:
            continue
        seen.add(id(operator))
        text = str(operator.spec)
        if text.startswith("OpSpec for decoders__Image"):
            arguments = text.split("Arguments:\n", 1)[1].splitlines()
            found.append(dict(line.strip().split(": ", 1) for line in arguments if ": " in line))
        stack.extend(operator.inputs)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.skipif(
    importlib.util.find_spec("nvidia.dali.plugin.triton") is None, reason="DALI's triton plugin is not installed"
)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("decoder, fancy", [(None, "True"), ("exact", "True"), ("fast", "False")])
def test_pipeline_file_decodes_as_the_spec_says(model, decoder, fancy):
    spec = variant(model_spec(model), decoder=decoder)
    text = dali_pipeline.pipeline_file(spec)
    namespace: dict = {"__name__": "dali_file"}
    exec(compile(text, dali_pipeline.PIPELINE_FILE, "exec"), namespace)  # noqa: S102 - the file this project writes
    assert namespace["PARAMS"]["decoder"] == (decoder or "exact")
    gpu = decoder_arguments(namespace, "gpu")
    assert (gpu["device"], gpu["jpeg_fancy_upsampling"]) == ("mixed", fancy)
    cpu = decoder_arguments(namespace, "cpu")
    assert cpu["device"] == "cpu" and "jpeg_fancy_upsampling" not in cpu  # the CPU path: libjpeg's own
    print(f"\n{model} decoder {decoder or '(default)'}: mixed, jpeg_fancy_upsampling {fancy}")


@pytest.mark.parametrize("model", MODELS)
def test_the_cpu_pipeline_is_the_same_for_either_decoder(model):
    photo = darknet_photos()["dog.jpg"]
    outputs = {}
    for decoder in ("exact", "fast"):
        pipeline = dali_pipeline.build_cpu_pipeline(variant(model_spec(model), decoder=decoder), batch_size=1)
        outputs[decoder] = dali_pipeline.run_cpu(pipeline, [photo])
    for exact, fast in zip(outputs["exact"], outputs["fast"]):
        assert np.array_equal(exact[0], fast[0])


@pytest.mark.parametrize("model", MODELS)
def test_config_carries_the_backend_threads(model):
    spec = model_spec(model)
    config = dali_pipeline.preprocess_config(spec, 16)
    assert dali_pipeline.GPU_THREADS == 4
    assert dict(config.parameters) == {"num_threads": mc.ModelParameter(string_value="4")}
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, mc.ModelInstanceGroup.KIND_GPU)]
    config = dali_pipeline.preprocess_config(spec, 16, threads=12)
    assert config.parameters["num_threads"].string_value == "12"
    text = dali_pipeline.preprocess_config_text(spec, 16, threads=12)
    assert 'key: "num_threads"' in text and 'string_value: "12"' in text
    for bad in (0, -1, True, 2.5, "4"):
        with pytest.raises(ValueError, match="threads"):
            dali_pipeline.preprocess_config(spec, 16, threads=bad)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("value", ["Fast", "nvjpeg", "", 1, True, ["fast"]])
def test_bad_decoder_is_refused_naming_the_file_and_the_key(model, value):
    spec = variant(model_spec(model), decoder=value)
    where = f"{spec.folder}/model.toml: [preprocess] decoder"
    for check in (
        lambda: offline_client(spec, Settings()),  # the router's start
        lambda: dali_pipeline.preprocess_params(spec),
        lambda: dali_pipeline.preprocess_config(spec, 8),
    ):
        with pytest.raises(SpecError) as raised:
            check()
        assert str(raised.value).startswith(where) and "'exact', 'fast'" in str(raised.value)


def test_misspelt_decoder_key_is_refused():
    spec = variant(model_spec("yolov5"), decodr="fast")
    with pytest.raises(SpecError, match=r"\[preprocess\] decodr is not a setting .*decoder"):
        offline_client(spec, Settings())


@pytest.mark.parametrize("model", MODELS)
def test_the_router_takes_either_decoder(model):
    for decoder in ("exact", "fast"):
        assert offline_client(variant(model_spec(model), decoder=decoder), Settings()).decoder == decoder
