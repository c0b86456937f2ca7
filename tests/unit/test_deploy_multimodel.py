"""deploy --multi-model against moto: the model's MultiModel container on the prefix of the per-model
archives, its cache setting, a CPU instance type (GPU ones refused before any call), and a --delete
that leaves nothing."""

from __future__ import annotations

import pytest

from scripts.sagemaker import deploy
from tests.support import IMAGE, deploy_argv, params

PREFIX = "s3://models-bucket/mme/"


def mme_argv(*extra: str) -> list[str]:
    return deploy_argv(*extra, models=("--multi-model", PREFIX))


def run(clients, argv) -> int:
    return deploy.main(argv, clients=clients, sleep=lambda s: None)


def test_the_model_is_a_multi_model_container_on_the_prefix(sent, capsys):
    clients, calls = sent
    assert run(clients, mme_argv()) == 0

    model = params(calls, "CreateModel")
    assert model["PrimaryContainer"] == {
        "Image": IMAGE,
        "ModelDataUrl": PREFIX,
        "Mode": "MultiModel",
        "MultiModelConfig": {"ModelCacheSetting": "Enabled"},
        "Environment": {"MODEL_SERVER_WORKERS": "2", "ENDPOINT_NAME": "mm"},
    }  # SageMaker itself sets SAGEMAKER_MULTI_MODEL=true
    (variant,) = params(calls, "CreateEndpointConfig")["ProductionVariants"]
    assert variant["ModelName"] == model["ModelName"]
    assert variant["InstanceType"] == deploy.MULTI_MODEL_INSTANCE_TYPE  # a CPU type unless told otherwise
    stored = clients.sagemaker.describe_model(ModelName=model["ModelName"])["PrimaryContainer"]
    assert (stored["Mode"], stored["ModelDataUrl"]) == ("MultiModel", PREFIX)
    assert params(calls, "RegisterScalableTarget")["ResourceId"] == "endpoint/mm/variant/AllTraffic"
    out = capsys.readouterr().out
    assert "multi-model: the archives under s3://models-bucket/mme/" in out
    assert "--target-model NAME.tar.gz NAME=FILE" in out


def test_the_cache_can_be_switched_off_and_the_prefix_gets_its_slash(sent):
    clients, calls = sent
    argv = mme_argv("--no-model-cache", "--instance-type", "ml.c5.2xlarge")
    argv[argv.index(PREFIX)] = PREFIX.rstrip("/")
    assert run(clients, argv) == 0
    container = params(calls, "CreateModel")["PrimaryContainer"]
    assert container["MultiModelConfig"] == {"ModelCacheSetting": "Disabled"}
    assert container["ModelDataUrl"] == PREFIX
    assert params(calls, "CreateEndpointConfig")["ProductionVariants"][0]["InstanceType"] == "ml.c5.2xlarge"


@pytest.mark.parametrize(
    "instance_type", ["ml.g4dn.xlarge", "ml.g5.2xlarge", "ml.p3.2xlarge", "ml.inf2.xlarge", "ml.trn1.2xlarge"]
)
def test_a_gpu_instance_type_is_refused_before_any_call(sent, capsys, instance_type):
    clients, calls = sent
    with pytest.raises(SystemExit):
        run(clients, mme_argv("--instance-type", instance_type))
    err = capsys.readouterr().err
    assert f"--multi-model on {instance_type}" in err
    assert "AWS's own Triton image" in err and "--inference-components" in err
    assert calls == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--model-data-url", "s3://models-bucket/model.tar.gz"), "--multi-model does not go with --model-data-url"),
        (("--async", "s3://answers-bucket/mm/"), "--multi-model does not go with --async"),
    ],
)
def test_what_multi_model_does_not_go_with(sent, capsys, extra, message):
    clients, calls = sent
    with pytest.raises(SystemExit):
        run(clients, mme_argv(*extra))
    assert message in capsys.readouterr().err
    assert calls == []


def test_one_archive_is_not_a_prefix(sent, capsys):
    clients, _ = sent
    argv = mme_argv()
    argv[argv.index(PREFIX)] = "s3://models-bucket/mme/resnet.tar.gz"
    with pytest.raises(SystemExit):
        run(clients, argv)
    assert "is one archive: give the prefix" in capsys.readouterr().err


def test_delete_leaves_nothing(sent):
    clients, _ = sent
    assert run(clients, mme_argv()) == 0
    assert run(clients, ["--name", "mm", "--delete", "--poll-seconds", "0"]) == 0
    sm = clients.sagemaker
    assert sm.list_endpoints()["Endpoints"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert sm.list_models()["Models"] == []
    assert clients.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
