"""The ModelDataUrl tarball: validated first, plain files only (links stored as files), uploaded to S3 (moto)."""

from __future__ import annotations

import tarfile

import boto3
import pytest
from moto import mock_aws

from scripts.sagemaker import package_models
from tests.support import make_package_repository


@pytest.fixture
def repo(tmp_path):
    return make_package_repository(tmp_path / "repo", tmp_path / "outside")


def test_tarball_holds_plain_files_at_the_top_level(repo, tmp_path):
    output = tmp_path / "model.tar.gz"
    assert package_models.main(["--repository", str(repo), "--output", str(output)]) == 0
    with tarfile.open(output) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert all(m.isfile() or m.isdir() for m in members.values())
        assert not any(m.issym() or m.islnk() for m in members.values())
        assert tar.extractfile("resnet/1/model.onnx").read() == b"onnx bytes"
        assert tar.extractfile("yolov5/1/model.onnx").read() == b"onnx bytes"
    assert {"resnet/config.pbtxt", "resnet/model.toml", "resnet/labels.txt", "yolov5/config.pbtxt"} <= set(members)
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in members)
    assert all(members[n].mode & 0o444 == 0o444 for n in members)  # readable by the image's non-root user


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda r: (r / "resnet" / "config.pbtxt").unlink(), "resnet: no config.pbtxt"),
        (lambda r: (r / "yolov5" / "model.toml").unlink(), "yolov5: no model.toml"),
        (lambda r: (r / "yolov5" / "1" / "model.onnx").unlink(), "yolov5/1: no model.onnx"),
        (lambda r: (r / "resnet" / "1").rename(r / "resnet" / "v1"), "resnet: no numbered version folder"),
        (
            lambda r: (r / "resnet" / "config.pbtxt").write_text('platform: "tensorrt_plan"\n'),
            "resnet/1: no model.plan",
        ),
    ],
)
def test_invalid_repository_is_refused_before_writing(repo, tmp_path, capsys, breakage, message):
    breakage(repo)
    output = tmp_path / "model.tar.gz"
    assert package_models.main(["--repository", str(repo), "--output", str(output)]) == 1
    assert message in capsys.readouterr().err
    assert not output.exists()


def test_broken_symlink_is_refused(repo, tmp_path, capsys):
    (repo / "resnet" / "extra.txt").symlink_to(tmp_path / "missing")
    assert package_models.main(["--repository", str(repo), "--check-only"]) == 1
    assert "resnet/extra.txt is a broken symlink" in capsys.readouterr().err


def test_the_built_test_repository_is_valid(repository, tmp_path):
    files = package_models.validate(repository)
    # the image models' Triton pipelines travel with them, without a model.toml of their own
    assert {f.parts[0] for f in files} == {
        "resnet",
        "yolov5",
        "bert_base",
        "resnet_preprocess",
        "resnet_pipeline",
        "yolov5_preprocess",
        "yolov5_pipeline",
    }
    output = tmp_path / "model.tar.gz"
    # bert_base's 0.4 GB of random weights would take most of a minute to gzip, and add nothing here
    images = [f for f in files if f.parts[0] != "bert_base"]
    package_models.write_tarball(repository, images, output, log=lambda line: None)
    members = package_models.check_tarball(output)
    assert "resnet_pipeline/1" in members  # an ensemble's empty version folder, which Triton needs
    assert "yolov5_preprocess/1/model.py" in members


def test_a_step_without_its_model_is_refused(repo):
    step = repo / "orphan_preprocess"
    (step / "1").mkdir(parents=True)
    (step / "1" / "model.py").write_text("")
    (step / "config.pbtxt").write_text('name: "orphan_preprocess"\nbackend: "python"\n')
    with pytest.raises(package_models.InvalidRepository, match="orphan_preprocess: no model.toml"):
        package_models.validate(repo)


def test_upload_to_s3(repo, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    output = tmp_path / "model.tar.gz"
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models-bucket")
        assert (
            package_models.main(
                [
                    "--repository",
                    str(repo),
                    "--output",
                    str(output),
                    "--region",
                    "us-east-1",
                    "--upload",
                    "s3://models-bucket/multi-model/",
                ]
            )
            == 0
        )
        head = s3.head_object(Bucket="models-bucket", Key="multi-model/model.tar.gz")
    assert head["ContentLength"] == output.stat().st_size
    assert "ModelDataUrl: s3://models-bucket/multi-model/model.tar.gz" in capsys.readouterr().out
