"""The text2text family against Hugging Face's ``generate``, in one process: small T5 (SentencePiece /
Unigram) and BART (byte-level BPE) folders, random-weight and trained (the "text2text" set of
scripts.model_prep.small_models, built once per run, prepared by ``python -m scripts.model_prep``),
served by the family's client, with the Triton model's own code (``app.triton.text2text_model.answer``)
standing in for Triton (the real stack: tests/integration/test_text2text.py).

Equal means token for token: the ids the Triton model returns for a text are the ids
``model.generate`` returns for that text alone, and the answer is their ``tokenizer.decode(...,
skip_special_tokens=True)``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import InferenceTimeout, InvalidInput
from app.core.generation_contract import OUTPUT_IDS, PAD, SETTING_NAMES, TIMEOUT_MS
from app.core.settings import PROJECT_ROOT
from scripts.model_prep.small_models.encoders import CORPUS, hf_folder, write_model_toml
from scripts.model_prep.small_models.seq2seq import HEADLINE_WORDS
from scripts.model_prep.small_models.sets import GENERATION_DEFAULTS, SETS, Built
from tests.references import in_process_clients, prepare_text_repository

MODELS = {
    name: (options["kind"], options.get("trained", False)) for name, (_, options) in SETS["text2text"].models.items()
}
TEXTS = [CORPUS[0], CORPUS[4], CORPUS[6], "Hi."]
LONG_TEXT = " ".join(CORPUS * 3)  # past the small models' 64 tokens
SETTINGS = [
    {"max_new_tokens": 12},
    {"max_new_tokens": 12, "num_beams": 4},
    {"max_new_tokens": 10, "num_beams": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3, "length_penalty": 0.6},
    {"max_new_tokens": 9, "num_beams": 2, "early_stopping": True, "min_new_tokens": 4},
]


FOLDER_SETTINGS = GENERATION_DEFAULTS  # bart_trained's generation_config.json sets them


class GeneratorTriton:
    """Triton's stand-in: each call answered by the Triton model's own ``answer`` (one request a
    call), errors as the router's Triton client raises them; the calls' outputs are kept."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.generators: dict = {}
        self.outputs: list[np.ndarray] = []

    def generator(self, model: str):
        from app.triton.text2text_model import Generator
        from clients.families import load_spec

        if model not in self.generators:
            spec = load_spec(self.repository / model)
            self.generators[model] = Generator(spec.text.folder, self.repository / model / "1", 1, (), 16)
        return self.generators[model]

    def infer(self, model, inputs, output_names, version=None):
        from tritonclient.utils import InferenceServerException

        from app.triton.text2text_model import answer
        from clients.triton import translate_error

        (found,) = answer(self.generator(model), [dict(inputs)], time.monotonic())
        if isinstance(found, Exception):
            raise translate_error(InferenceServerException(str(found), status="StatusCode.INTERNAL"), model) or found
        self.outputs.append(found)
        return {OUTPUT_IDS: found}, "1"


@pytest.fixture(scope="module")
def built(small_models: Built) -> tuple[Path, Path]:
    # bart_trained: a folder whose generation_config.json sets what generate() does by default
    models = small_models.models("text2text")
    assert (
        json.loads((models / "bart_trained" / "hf" / "generation_config.json").read_text()).items()
        >= FOLDER_SETTINGS.items()
    )
    return models, small_models.repository("text2text")


@pytest.fixture(scope="module")
def triton(built) -> GeneratorTriton:
    return GeneratorTriton(built[1])


@pytest.fixture(scope="module")
def clients(built, triton):
    return in_process_clients(built[1], triton)


@pytest.fixture(scope="module")
def references(built):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return {
        name: (
            AutoModelForSeq2SeqLM.from_pretrained(built[0] / name / "hf").eval(),
            AutoTokenizer.from_pretrained(built[0] / name / "hf"),
        )
        for name in MODELS
    }


def generate(references, name: str, text: str, **settings) -> list[int]:
    import torch

    model, tokenizer = references[name]
    with torch.no_grad():
        return model.generate(**tokenizer(text, return_tensors="pt"), **settings)[0].tolist()


def served_ids(triton: GeneratorTriton, count: int) -> list[list[int]]:
    """The ids of the last ``count`` texts the stand-in answered, each without its padding."""
    rows = [row for output in triton.outputs for row in output][-count:]
    return [[int(t) for t in row if t != PAD] for row in rows]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "beam", "penalties", "early_stopping"])
def test_texts_equal_generate_token_for_token(built, clients, triton, references, name, settings):
    answers = clients[name].inference({"text": TEXTS, **settings})[0]
    _, tokenizer = references[name]
    wanted = [generate(references, name, text, **settings) for text in TEXTS]
    assert served_ids(triton, len(TEXTS)) == wanted
    assert answers == [{"generated_text": tokenizer.decode(ids, skip_special_tokens=True)} for ids in wanted]


def test_trained_models_answer_what_they_learned(clients):
    """Not a degenerate answer: the trained models learned their task (the first words of the text)."""
    for name in ("t5_trained", "bart_trained"):
        for text in (CORPUS[0], CORPUS[4], CORPUS[6]):
            answer = clients[name].inference({"text": text, "max_new_tokens": 30})[0]["generated_text"]
            assert answer == " ".join(text.split()[:HEADLINE_WORDS]), (name, text, answer)


def test_one_text_answers_one_result_and_the_folders_settings_are_the_defaults(built, clients, triton, references):
    for name in ("t5_random", "bart_random"):  # random weights run to the default length
        config = json.loads((built[1] / name / "hf" / "generation_config.json").read_text())
        assert "max_length" not in config and "max_new_tokens" not in config
        answer, _ = clients[name].inference({"text": CORPUS[1]})
        ids = served_ids(triton, 1)[0]
        assert ids == generate(references, name, CORPUS[1])
        assert name != "t5_random" or len(ids) == 1 + 20  # this one never ends by itself
        assert answer == {"generated_text": references[name][1].decode(ids, skip_special_tokens=True)}


def test_a_folders_generation_config_sets_the_defaults(clients, triton, references):
    client = clients["bart_trained"]
    assert {k: client.options[k].default for k in ("num_beams", "max_new_tokens", "no_repeat_ngram_size")} == {
        "num_beams": 3,
        "max_new_tokens": 11,
        "no_repeat_ngram_size": 2,
    }
    client.inference({"text": TEXTS})
    assert served_ids(triton, len(TEXTS)) == [generate(references, "bart_trained", text) for text in TEXTS]


def test_a_folder_saved_before_generation_configs_takes_its_settings_from_config_json(built, tmp_path):
    """No generation_config.json: the settings of config.json, as from_pretrained reads them."""
    import shutil

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    shutil.copytree(built[0] / "t5_random", tmp_path / "models" / "legacy")
    folder = tmp_path / "models" / "legacy" / "hf"
    (folder / "generation_config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **FOLDER_SETTINGS}))
    repository = prepare_text_repository(tmp_path / "models", tmp_path / "repository")
    client = in_process_clients(repository, GeneratorTriton(repository))["legacy"]
    assert client.options["num_beams"].default == 3 and client.options["max_new_tokens"].default == 11
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        wanted = model.generate(**tokenizer(TEXTS[1], return_tensors="pt"))[0]
    assert client.inference({"text": TEXTS[1]})[0] == {
        "generated_text": tokenizer.decode(wanted, skip_special_tokens=True)
    }


def test_texts_with_other_settings_in_one_call_each_equal_their_own_generate(clients, triton, references):
    """Rows of several payloads (JSON Lines) go to Triton together; each text is generated with its
    own settings, and its answer does not depend on the others."""
    client = clients["bart_trained"]
    works = [client.plan({"text": TEXTS[:2], **SETTINGS[1]}), client.plan({"text": TEXTS[2:], **SETTINGS[2]})]
    before = len(triton.outputs)
    results = client.run(works)
    assert len(triton.outputs) == before + 1  # one call to Triton for both payloads
    wanted = [generate(references, "bart_trained", t, **SETTINGS[1]) for t in TEXTS[:2]]
    wanted += [generate(references, "bart_trained", t, **SETTINGS[2]) for t in TEXTS[2:]]
    assert served_ids(triton, 4) == wanted
    assert [r["generated_text"] for r in results[0][0] + results[1][0]] == [
        references["bart_trained"][1].decode(ids, skip_special_tokens=True) for ids in wanted
    ]


def test_truncation_equals_generate_on_the_truncated_text_and_without_it_a_long_text_is_refused(
    clients, triton, references
):
    client = clients["t5_trained"]
    with pytest.raises(InvalidInput, match=r"payload.text is \d+ tokens .*over the model's limit of 64"):
        client.inference({"text": LONG_TEXT})
    client.inference({"text": LONG_TEXT, "truncation": True, "max_new_tokens": 8})
    model, tokenizer = references["t5_trained"]
    import torch

    with torch.no_grad():
        wanted = model.generate(
            **tokenizer(LONG_TEXT, truncation=True, max_length=64, return_tensors="pt"), max_new_tokens=8
        )
    assert served_ids(triton, 1) == [wanted[0].tolist()]


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"text": 7}, "payload.text must be a string"),
        ({"text": ["a", None]}, "payload.text[1] must be a string"),
        ({"text": "a", "do_sample": True}, "payload.do_sample: sampling is not served"),
        ({"text": "a", "num_beams": 9}, "payload.num_beams must be between 1 and 8"),
        ({"text": "a", "max_new_tokens": 64}, "payload.max_new_tokens must be between 1 and 63"),  # BART: 64 positions
        ({"text": "a", "max_new_tokens": 0}, "payload.max_new_tokens must be between 1 and 63"),
        ({"text": "a", "max_new_tokens": 4, "min_new_tokens": 5}, "payload.min_new_tokens (5) must not be more than"),
        ({"text": "a", "early_stopping": "yes"}, "payload.early_stopping must be true or false"),
        ({"text": "a", "temperature": 0.7}, "payload.temperature is not an option"),
    ],
)
def test_bad_input_is_refused_naming_the_field(clients, payload, fragment):
    with pytest.raises(InvalidInput) as refused:
        clients["bart_random"].inference(payload)
    assert fragment in refused.value.message


def test_t5_takes_up_to_the_documented_bound_of_new_tokens(clients):
    assert clients["t5_random"].options["max_new_tokens"].maximum == 512
    with pytest.raises(InvalidInput, match="between 1 and 512"):
        clients["t5_random"].inference({"text": "a", "max_new_tokens": 513})


def test_a_text_past_its_deadline_is_answered_late_and_the_others_of_its_batch_are_not(triton, references):
    from app.triton.text2text_model import Late, answer

    generator = triton.generator("t5_random")
    tokenizer = references["t5_random"][1]

    def request(text: str, timeout_ms: int, **settings) -> dict[str, np.ndarray]:
        ids = np.array([tokenizer(text).input_ids], dtype=np.int64)
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), TIMEOUT_MS: np.array([[timeout_ms]])}
        values = {"max_new_tokens": 19, "min_new_tokens": 0, "num_beams": 1, "length_penalty": 1.0}
        values.update({"early_stopping": False, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0, **settings})
        dtypes = {"length_penalty": np.float64, "repetition_penalty": np.float64, "early_stopping": np.bool_}
        for key in SETTING_NAMES:
            arrays[key] = np.array([[values[key]]], dtype=dtypes.get(key, np.int32))
        return arrays

    # both texts ask for the same settings, so they are generated in one batch
    slow = {"max_new_tokens": 64, "min_new_tokens": 64}
    late, on_time = answer(
        generator, [request(CORPUS[0], 1, **slow), request(CORPUS[1], 60_000, **slow)], time.monotonic()
    )
    assert isinstance(late, Late) and "generation stopped at its deadline of 1 ms" in str(late)
    assert on_time[0].tolist() == generate(references, "t5_random", CORPUS[1], **slow)


def test_a_request_of_the_tokens_alone_takes_the_folders_settings(built, triton, references):
    """What a KServe v2 body may send (the config marks the settings and timeout_ms optional): the
    settings it leaves out are the folder's, so its ids are what ``generate`` gives the text with none."""
    from app.triton.text2text_model import answer
    from clients.v2_checks import ModelContract

    config = ModelContract.from_pbtxt("bart_trained", (built[1] / "bart_trained" / "config.pbtxt").read_text())
    assert {name for name, spec in config.inputs.items() if spec.optional} == {*SETTING_NAMES, TIMEOUT_MS}
    tokenizer = references["bart_trained"][1]
    for left_out in ("as None", "absent"):  # as execute() reads a missing optional input, or not there at all
        requests = []
        for text in TEXTS[:2]:
            ids = np.array([tokenizer(text).input_ids], dtype=np.int64)
            arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            requests.append(arrays | (dict.fromkeys((*SETTING_NAMES, TIMEOUT_MS)) if left_out == "as None" else {}))
        found = answer(triton.generator("bart_trained"), requests, time.monotonic())
        assert [[int(t) for t in row if t != PAD] for (row,) in found] == [
            generate(references, "bart_trained", text) for text in TEXTS[:2]
        ]


def test_the_deadline_error_is_the_routers_504_naming_it():
    from tritonclient.utils import InferenceServerException

    from clients.triton import translate_error

    error = translate_error(InferenceServerException("generation stopped at its deadline of 250 ms"), "t5")
    assert isinstance(error, InferenceTimeout) and error.status == 504
    assert "deadline of 250 ms" in error.message and "TRITON_TIMEOUT_S" in error.message


def test_the_sizing_plan_counts_each_text2text_model_as_a_cpu_network(built):
    """generate() runs in the python backend on every target: serve's plan gives each model
    instances x threads of the CPU budget, on a GPU instance too."""
    from app.core.machine import INSTANCE_TYPES
    from app.serve.sizing_plan import plan_for

    for instance_type, target in (("ml.g5.2xlarge", "tensorrt"), ("ml.c5.4xlarge", "python")):
        plan = plan_for(INSTANCE_TYPES[instance_type], built[1], target)
        assert {part.triton_name for part in plan.parts} == set(MODELS), instance_type
        for name in MODELS:
            part = plan.part(name)
            assert part.count >= 1 and not part.on_gpu and part.cpu == part.count * part.threads, part
        assert plan.cpu_threads == plan.router_workers + plan.nginx_workers + sum(p.cpu for p in plan.parts)


STUB = """
import sys, torch
from app.triton.text2text_model import TritonPythonModel
before = torch.get_num_threads()
TritonPythonModel().initialize({"model_config": sys.argv[1], "model_repository": sys.argv[2], "model_version": "1"})
print(before, torch.get_num_threads())
"""


def test_a_stub_s_pytorch_takes_the_threads_the_sizing_gave_its_instance(built):
    """generate()'s own tensor work (logits processors, beam scores over the vocabulary) runs on the
    instance's threads, as its ONNX Runtime sessions do, not on every core in each instance's stub
    (two instances on 2 vCPUs generated half the tokens a second with PyTorch's default). 3: not any
    machine's default here, so the test tells the two apart."""
    from google.protobuf import json_format

    from app.triton.onnx_model import ORT_THREADS_PARAMETER
    from scripts.model_prep.triton_config import read_config

    model = built[1] / "t5_random"
    config = json_format.MessageToDict(read_config(model / "config.pbtxt"), preserving_proto_field_name=True)
    config.setdefault("parameters", {})[ORT_THREADS_PARAMETER] = {"string_value": "3"}
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", STUB, json.dumps(config), str(model)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = map(int, done.stdout.split()[-2:])
    assert after == 3, f"the stub's PyTorch kept its {before} threads"


@pytest.mark.parametrize("target", ["onnxruntime", "tensorrt"])
def test_every_target_gets_the_python_backend_with_its_providers(built, small_models, tmp_path, target):
    from scripts.model_prep.triton_config import read_config

    repository = prepare_text_repository(
        built[0],
        tmp_path / "repository",
        *("--target", target, "--config-only", "--models", "t5_random"),
        cache=small_models.cache,
    )
    config = read_config(repository / "t5_random" / "config.pbtxt")
    assert config.backend == "python" and not config.platform
    providers = config.parameters["ort_providers"].string_value.split(",")
    assert providers[-1] == "CPUExecutionProvider" and providers[0] != "CPUExecutionProvider"
    assert sorted(p.name for p in (repository / "t5_random" / "1").iterdir()) == ["model.py"]
    assert [i.name for i in config.input][:2] == ["input_ids", "attention_mask"]


def test_a_folder_that_is_not_an_encoder_decoder_stops_with_one_line(tmp_path, capsys):
    from scripts.model_prep import cli

    hf_folder(tmp_path / "models" / "bert2text" / "hf", head="masked")
    write_model_toml(tmp_path / "models" / "bert2text", "text2text_generation")
    capsys.readouterr()
    argv = ["--source", str(tmp_path / "models"), "--repository", str(tmp_path / "repository")]
    assert cli.main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bert2text" in err[0] and "serves encoder-decoder models" in err[0], err
