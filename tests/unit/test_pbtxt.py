"""``app.core.pbtxt`` (the multi-model loader's reading and renaming of config.pbtxt) against
protobuf's own text-format parser and Triton's ModelConfig, on every config ``make models`` writes
for every target, and on the forms of the text format users write by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from app.core import pbtxt
from app.core.pipeline import SOURCE_PARAMETER, ensemble_model
from tests.support import IMAGE_MODELS, TARGETS, wiring_problems

PREFIX = "tenant-a.1234abcd--"


def configs(repository: Path) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted(repository.glob("*/config.pbtxt"))}


@pytest.mark.parametrize("target", TARGETS)
def test_what_is_read_agrees_with_model_config(repositories, target):
    for folder, text in configs(repositories[target]).items():
        theirs = text_format.Parse(text, mc.ModelConfig())
        ours = pbtxt.parse(text)
        assert ours.string("name") == theirs.name == folder
        assert pbtxt.is_ensemble(ours) == (theirs.platform == "ensemble")
        assert pbtxt.step_models(ours) == [step.model_name for step in theirs.ensemble_scheduling.step]


@pytest.mark.parametrize("target", TARGETS)
def test_a_renamed_repository_differs_only_in_model_names_and_is_wired_as_before(repositories, target, tmp_path):
    texts = configs(repositories[target])
    names = {folder: PREFIX + folder for folder in texts}
    renamed_repository = tmp_path / "renamed"
    for folder, text in texts.items():
        renamed = pbtxt.rename(text, names)
        expected = text_format.Parse(text, mc.ModelConfig())
        expected.name = names[expected.name]
        for step in expected.ensemble_scheduling.step:
            step.model_name = names[step.model_name]
        if SOURCE_PARAMETER in expected.parameters:
            source = expected.parameters[SOURCE_PARAMETER]
            source.string_value = names[source.string_value]
        assert text_format.Parse(renamed, mc.ModelConfig()) == expected, folder
        shutil.copytree(repositories[target] / folder, renamed_repository / names[folder], symlinks=True)
        (renamed_repository / names[folder] / "config.pbtxt").write_text(renamed)
    for model in IMAGE_MODELS:
        assert wiring_problems(renamed_repository, PREFIX + ensemble_model(model)) == []


def test_the_forms_people_write_by_hand():
    text = """# a hand-written config
name:'net'  platform : "ensemble"
input [ { name: "name" dims: [ 3, -1 ] }, { name: 'b' } ]
ensemble_scheduling < step { model_name: "pre" model_version: -1 } step: { model_name: "net_core"; } >
parameters: { key: "source_model", value: { string_value: "net_core" } }
parameters { key: "other" value { string_value: "net_core" } }
some_future_field { x: 1.5e3 y: TYPE_FP32 z: "a\\"b" }
"""
    config = pbtxt.parse(text)
    assert config.string("name") == "net" and pbtxt.is_ensemble(config)
    assert pbtxt.step_models(config) == ["pre", "net_core"]
    assert [i.string("name") for i in config.messages("input")] == ["name", "b"]
    assert next(config.messages("some_future_field")).string("z") == 'a"b'
    renamed = pbtxt.rename(text, {"net": "p--net", "pre": "p--pre", "net_core": "p--net_core", "name": "never"})
    assert renamed == (
        text.replace("name:'net'", 'name:"p--net"')
        .replace('"pre"', '"p--pre"')
        .replace('model_name: "net_core"', 'model_name: "p--net_core"')
        .replace(
            'key: "source_model", value: { string_value: "net_core"',
            'key: "source_model", value: { string_value: "p--net_core"',
        )
    )
    assert 'key: "other" value { string_value: "net_core" }' in renamed  # not a model parameter: kept


def test_a_config_without_a_top_level_name_is_not_named_by_its_tensors():
    config = pbtxt.parse('input {\n  name: "image"\n}\nbackend: "python"\n')
    assert config.string("name") is None


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('name: "a"\ninput { name: "x"\n', "not closed"),
        ('name "a"', "expected ':' or a message"),
        ('name: "a" }', "expected a field name"),
        ('name: "a\n"', "unexpected"),
    ],
)
def test_text_that_is_not_protobuf_text_format_is_refused_with_where(text, fragment):
    with pytest.raises(pbtxt.PbtxtError, match=fragment):
        pbtxt.parse(text)
