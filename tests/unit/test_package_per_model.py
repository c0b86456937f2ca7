"""package_models --per-model: one archive per served model (its network with its Triton pipeline's
folders; a chain with the folders of the models it names; a plain Triton model on its own), each checked, written with the repository's own writer,
progress on stderr, uploaded under one S3 prefix (moto)."""

from __future__ import annotations

import tarfile

import boto3
import pytest

from scripts.sagemaker import package_models
from tests.support import REGION, make_package_repository

IDENTITY_CONFIG = 'name: "identity"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def add_pipeline(root, name):
    """The steps `prepare_models` writes for an image model on the Triton pipeline."""
    step = root / f"{name}_preprocess"
    (step / "1").mkdir(parents=True)
    (step / "1" / "model.py").write_text("# the preprocessing step\n")
    (step / "config.pbtxt").write_text(f'name: "{name}_preprocess"\nbackend: "python"\n')
    ensemble = root / f"{name}_pipeline"
    (ensemble / "1").mkdir(parents=True)  # an ensemble's version folder stays empty
    (ensemble / "config.pbtxt").write_text(f'name: "{name}_pipeline"\nplatform: "ensemble"\n')


@pytest.fixture
def repo(tmp_path):
    root = make_package_repository(tmp_path / "repo", tmp_path / "outside")
    add_pipeline(root, "resnet")
    plain = root / "identity"  # a plain Triton model: no model.toml
    (plain / "1").mkdir(parents=True)
    (plain / "1" / "model.onnx").write_bytes(b"identity onnx")
    (plain / "config.pbtxt").write_text(IDENTITY_CONFIG)
    return root


def members(archive):
    with tarfile.open(archive) as tar:
        return {m.name: m for m in tar.getmembers()}


def top_level(archive):
    return {name.split("/")[0] for name in members(archive)}


def test_one_archive_per_served_model_with_its_pipeline(repo, tmp_path, capsys):
    out = tmp_path / "archives"
    assert package_models.main(["--repository", str(repo), "--per-model", "--output", str(out)]) == 0

    assert sorted(p.name for p in out.iterdir()) == ["identity.tar.gz", "resnet.tar.gz", "yolov5.tar.gz"]
    assert top_level(out / "resnet.tar.gz") == {"resnet", "resnet_preprocess", "resnet_pipeline"}
    assert top_level(out / "yolov5.tar.gz") == {"yolov5"}
    assert top_level(out / "identity.tar.gz") == {"identity"}
    resnet = members(out / "resnet.tar.gz")
    assert resnet["resnet_pipeline/1"].isdir()  # the ensemble's empty version folder travels
    assert {"resnet/model.toml", "resnet/1/model.onnx", "resnet_preprocess/1/model.py"} <= set(resnet)
    assert not any(m.issym() or m.islnk() for m in resnet.values())  # the symlinked model.onnx is a file
    with tarfile.open(out / "resnet.tar.gz") as tar:
        assert tar.extractfile("resnet/1/model.onnx").read() == b"onnx bytes"

    captured = capsys.readouterr()
    assert "[1/3] identity: identity ->" in captured.err
    assert "[2/3] resnet: resnet, resnet_pipeline, resnet_preprocess ->" in captured.err
    assert f"wrote {out / 'yolov5.tar.gz'}" in captured.err
    assert "writing 3 archives (identity, resnet, yolov5)" in captured.out


def test_the_groups_follow_app_pipeline_names(repository):
    from app.core.pipeline import ensemble_model, preprocess_model

    groups = package_models.per_model(repository, package_models.validate(repository, plain=True))
    assert set(groups) == {"resnet", "yolov5", "bert_base"}
    folders = {name: {f.parts[0] for f in files} for name, files in groups.items()}
    assert folders["yolov5"] == {
        "yolov5",
        preprocess_model("yolov5"),
        ensemble_model("yolov5"),
    }
    assert folders["bert_base"] == {"bert_base"}  # a text model has no Triton pipeline


def test_without_per_model_a_plain_folder_still_needs_its_model_toml(repo, tmp_path, capsys):
    assert package_models.main(["--repository", str(repo), "--output", str(tmp_path / "model.tar.gz")]) == 1
    assert "identity: no model.toml" in capsys.readouterr().err


def test_an_invalid_repository_writes_no_archive(repo, tmp_path, capsys):
    (repo / "yolov5" / "1" / "model.onnx").unlink()
    out = tmp_path / "archives"
    assert package_models.main(["--repository", str(repo), "--per-model", "--output", str(out)]) == 1
    assert "yolov5/1: no model.onnx" in capsys.readouterr().err
    assert not out.exists()


def test_a_chain_carries_the_models_it_names_and_one_it_names_that_is_missing_is_refused(repo, tmp_path, capsys):
    chain = repo / "chain"
    (chain / "1").mkdir(parents=True)
    (chain / "1" / "model.py").write_text("# the chain\n")
    (chain / "config.pbtxt").write_text('name: "chain"\nbackend: "python"\n')
    (chain / "model.toml").write_text('family = "grounded_segmentation"\ndetector = "yolov5"\nsegmenter = "sam"\n')
    out = tmp_path / "archives"
    assert package_models.main(["--repository", str(repo), "--per-model", "--output", str(out)]) == 1
    assert "chain: segmenter = 'sam' is not a model folder of the repository (no sam/model.toml)" in (
        capsys.readouterr().err
    )
    (chain / "model.toml").write_text('family = "grounded_segmentation"\ndetector = "yolov5"\nsegmenter = "resnet"\n')
    assert package_models.main(["--repository", str(repo), "--per-model", "--output", str(out)]) == 0
    assert top_level(out / "chain.tar.gz") == {"chain", "yolov5", "resnet"}  # not resnet's pipeline steps
    assert top_level(out / "yolov5.tar.gz") == {"yolov5"}  # each also alone


def test_upload_puts_each_archive_under_the_prefix(aws, repo, tmp_path, capsys):
    out = tmp_path / "archives"
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models-bucket")
    assert (
        package_models.main(
            ["--repository", str(repo), "--per-model", "--output", str(out), "--upload", "s3://models-bucket/mme"]
        )
        == 0
    )
    sizes = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket="models-bucket")["Contents"]}
    assert sizes == {f"mme/{p.name}": p.stat().st_size for p in out.iterdir()}
    captured = capsys.readouterr()
    assert "python -m scripts.sagemaker deploy --multi-model s3://models-bucket/mme/" in captured.out
    assert "uploading resnet.tar.gz to s3://models-bucket/mme/" in captured.err
