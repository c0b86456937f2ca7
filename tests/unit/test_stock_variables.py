"""AWS's SageMaker Triton image's variables, turned into tritonserver flags as its `serve` does."""

from __future__ import annotations

from pathlib import Path

from app.serve.tritonserver import TritonInstall, stock_flags, triton_command


def test_no_variables_no_flags():
    assert stock_flags({}, gpus=0) == []


def test_each_variable_becomes_its_flag():
    env = {
        "SAGEMAKER_TRITON_LOG_VERBOSE": "1",
        "SAGEMAKER_TRITON_LOG_INFO": "false",
        "SAGEMAKER_TRITON_LOG_WARNING": "true",
        "SAGEMAKER_TRITON_LOG_ERROR": "true",
        "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "33554432",
        "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2097152",
        "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "4",
        "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8",
        "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--rate-limit=execution_count --log-format 'ISO8601'",
    }
    assert stock_flags(env, gpus=2) == [
        "--log-verbose=1",
        "--log-info=false",
        "--log-warning=true",
        "--log-error=true",
        "--backend-config=python,shm-default-byte-size=33554432",
        "--backend-config=python,shm-growth-byte-size=2097152",
        "--buffer-manager-thread-count=4",
        "--model-load-gpu-limit=0:0.8",
        "--model-load-gpu-limit=1:0.8",
        "--rate-limit=execution_count",
        "--log-format",
        "ISO8601",
    ]


def test_blank_variables_are_not_set_and_the_flags_reach_the_command():
    assert (
        stock_flags({"SAGEMAKER_TRITON_LOG_INFO": "  ", "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.5"}, gpus=0) == []
    )
    command = triton_command(
        TritonInstall(Path("/bin/tritonserver")),
        Path("/m"),
        (1, 2, 3),
        extra_args=stock_flags({"SAGEMAKER_TRITON_LOG_VERBOSE": "2"}, gpus=0),
    )
    assert command[-1] == "--log-verbose=2" and command[0] == "/bin/tritonserver"
