"""The processes the benchmark starts: the peer Triton (SageMaker front end), its own stack, and
the repositories they load (the identity model, resnet without dynamic batching)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.spec import ModelSpec
from scripts.bench.constants import IDENTITY, IDENTITY_WAIT, IDENTITY_WAIT_MS, NOBATCH_SUFFIX, START_TIMEOUT_S
from scripts.bench.placement import link_models, write_router_copies
from scripts.devtools import (
    Stack,
    Triton,
    free_ports,
    rss_kib,
    start_triton,
    wait_http,
)
from scripts.model_prep import triton_config

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


@dataclass
class Peer(Triton):
    """A second Triton with its SageMaker front end, serving one model (and resnet without batching)."""

    sagemaker_port: int = 0


def start_peer(
    model: str, repositories: Sequence[Path], extra_models: Sequence[str], runtime: Path, log_path: Path
) -> Peer:
    http_port, grpc_port, metrics_port, sagemaker_port = free_ports(4)
    extra = [f"--model-repository={r}" for r in repositories[1:]]
    extra += [
        "--allow-sagemaker=true",
        f"--sagemaker-port={sagemaker_port}",
        "--model-control-mode=explicit",
        f"--load-model={model}",
    ]
    extra += [f"--load-model={m}" for m in extra_models]
    with log_path.open("ab") as log:
        triton = start_triton(
            repositories[0],
            runtime,
            (http_port, grpc_port, metrics_port),
            extra,
            {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": model},
            log,
        )
    peer = Peer(triton.proc, triton.ports, sagemaker_port)
    try:
        peer.wait_ready(START_TIMEOUT_S, (model, *extra_models))
        wait_http("127.0.0.1", sagemaker_port, "/ping", 30, peer.proc)
    except Exception:
        peer.stop()
        raise
    return peer


def start_own_stack(repository: Path, log_dir: Path) -> Stack:
    """``serve`` on ``repository`` on free ports; its ``start_to_ping_s`` is the time to /ping 200."""
    stack = Stack(repository).start(log_dir)
    try:
        stack.start_to_ping_s = stack.wait_healthy(START_TIMEOUT_S)
    except Exception:
        stack.stop()
        raise
    return stack


def rss_mb(pid: int) -> float | None:
    kib = rss_kib(pid)
    return None if kib is None else kib / 1024.0


IDENTITY_LENGTH = 16
IDENTITY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "."]

IDENTITY_TOML = f"""# The benchmark's trivial model: echoes its token ids as the one candidate of every position.
# It rides the fill_mask family, so the router serves it with no code of its own: the router's
# own cost (tokenise a short text, one gRPC call on [1, {IDENTITY_LENGTH}] tensors, build the answer).
family = "fill_mask"
description = "identity: token ids in, the same ids out (benchmark only)"
max_batch_size = 8

[[inputs]]
name = "input_ids"
dtype = "INT64"
dims = [{IDENTITY_LENGTH}]

[[inputs]]
name = "attention_mask"
dtype = "INT64"
dims = [{IDENTITY_LENGTH}]

[[outputs]]
name = "scores"
dtype = "FP32"
dims = [{IDENTITY_LENGTH}, 1]

[[outputs]]
name = "token_ids"
dtype = "INT64"
dims = [{IDENTITY_LENGTH}, 1]

[preprocess]
sequence_length = {IDENTITY_LENGTH}
vocab = "vocab.txt"
lowercase = true

[postprocess]
topk = 1
max_topk = 1
"""


def identity_config(name: str = IDENTITY, wait_ms: int = 0) -> str:
    """The identity model's config; ``wait_ms``: it answers each batch that much later (dynamically
    batched, so that requests wait as long as a real model's do, with no CPU spent)."""
    waiting = (
        f'dynamic_batching {{ max_queue_delay_microseconds: 1000 }}\nparameters {{ key: "wait_ms" value {{ string_value: "{wait_ms}" }} }}\n'
        if wait_ms
        else ""
    )
    return f"""name: "{name}"
backend: "python"
max_batch_size: 8
input {{ name: "input_ids" data_type: TYPE_INT64 dims: [{IDENTITY_LENGTH}] }}
input {{ name: "attention_mask" data_type: TYPE_INT64 dims: [{IDENTITY_LENGTH}] }}
output {{ name: "scores" data_type: TYPE_FP32 dims: [{IDENTITY_LENGTH}, 1] }}
output {{ name: "token_ids" data_type: TYPE_INT64 dims: [{IDENTITY_LENGTH}, 1] }}
instance_group {{ count: 1 kind: KIND_CPU }}
{waiting}"""


IDENTITY_MODEL = '''"""The benchmark's identity model: token_ids = input_ids, scores = 1 (after the
config's wait_ms, when it has one)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.wait_s = float(parameters.get("wait_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        if self.wait_s:
            time.sleep(self.wait_s)
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()[..., None]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("scores", np.ones(ids.shape, np.float32)),
                pb_utils.Tensor("token_ids", ids.astype(np.int64)),
            ]))
        return responses
'''


def write_bench_repositories(out: Path, repository: Path, specs: Mapping[str, ModelSpec]) -> tuple[Path, Path]:
    """``out/stack-repository``: the identity model (and its copy that waits), links to the served models and their Triton
    pipelines, and each image model's copy on the router's pipeline (the benchmark's own stack,
    ``scripts.bench.placement``); ``out/nobatch-repository``: resnet without dynamic batching."""
    models = list(specs)
    stack_repo = out / "stack-repository"
    if stack_repo.exists():
        shutil.rmtree(stack_repo)
    for name, wait_ms in ((IDENTITY, 0), (IDENTITY_WAIT, IDENTITY_WAIT_MS)):
        identity = stack_repo / name
        (identity / "1").mkdir(parents=True)
        (identity / "model.toml").write_text(IDENTITY_TOML)
        (identity / "config.pbtxt").write_text(identity_config(name, wait_ms))
        (identity / "vocab.txt").write_text("\n".join(IDENTITY_VOCAB) + "\n")
        (identity / "1" / "model.py").write_text(IDENTITY_MODEL)
    link_models(stack_repo, repository, models)
    write_router_copies(stack_repo, repository, specs)

    nobatch_repo = out / "nobatch-repository"
    if nobatch_repo.exists():
        shutil.rmtree(nobatch_repo)
    if "resnet" in models:
        name = f"resnet{NOBATCH_SUFFIX}"
        folder = nobatch_repo / name
        folder.mkdir(parents=True)
        config = triton_config.read_config(repository / "resnet" / "config.pbtxt")
        folder.joinpath("config.pbtxt").write_text(_without_dynamic_batching(config, name))
        (folder / "1").symlink_to((repository / "resnet" / "1").resolve(), target_is_directory=True)
    return stack_repo, nobatch_repo


def _without_dynamic_batching(config: ModelConfig, name: str) -> str:
    """The text of a copy of ``config`` renamed and with its dynamic_batching block removed."""
    copy = type(config)()
    copy.CopyFrom(config)
    copy.name = name
    copy.ClearField("dynamic_batching")
    return triton_config.to_text(copy)
