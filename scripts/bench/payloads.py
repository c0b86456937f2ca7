"""What each side sends: the product's HTTP requests, the peer's KServe v2 bodies, B's gRPC request.

The model-only tensors are what the router itself would send: the model's own client preprocesses
the sample (``clients``), so the benchmark keeps no second copy of resize, letterbox or tokenizer.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.pipeline import ROUTER
from app.core.settings import Settings
from app.core.spec import ModelSpec
from scripts.bench.constants import BINARY_JSON, CUSTOM_ATTRIBUTES

TEXT_FIELD = "text"  # the input field of the families that read texts (clients.text)


@dataclass(frozen=True)
class HttpRequest:
    host: str
    port: int
    path: str
    body: bytes
    headers: Mapping[str, str]


def preprocessed_tensors(
    spec: ModelSpec, image: Path, text: str, route_name: str = ROUTER
) -> tuple[dict[str, Any], list[str]]:
    """The batch-1 tensors the router would send to the network itself for this sample, and the
    outputs it asks for: the model's own client (its family in ``clients.families``) preprocesses
    it on its route to the network, with the model's default options (a detector whose graph
    post-processes also sends the letterbox's geometry and the options, and reads detections).
    ``route_name`` ``TRITON``: what it sends to the model's Triton pipeline instead (the encoded image)."""
    from clients.families import offline_client

    client = offline_client(spec, Settings())
    route = client.routes[route_name]
    item = text if client.input_field == TEXT_FIELD else image.read_bytes()
    arrays, _ = route.prepare(item, "the sample", client.parse_options({}))
    return client._stack([arrays], route.inputs), [t.name for t in route.outputs]


def takes_text(spec: ModelSpec) -> bool:
    """Whether the model's family reads texts (its sample is the text), not images."""
    from clients.families import family_of

    return family_of(spec).client.input_field == TEXT_FIELD


def product_requests(
    model: str, spec: ModelSpec, host: str, port: int, image: bytes, text: str
) -> dict[str, HttpRequest]:
    """A-json and A-raw for one model."""
    if takes_text(spec):
        payload: dict[str, Any] = {TEXT_FIELD: text}
        raw, raw_type = text.encode(), "text/plain; charset=utf-8"
    else:
        payload = {"img": base64.b64encode(image).decode("ascii")}
        raw, raw_type = image, "image/jpeg"
    envelope = json.dumps({"modelname": model, "payload": payload}).encode()
    return {
        "A-json": HttpRequest(host, port, "/invocations", envelope, {"Content-Type": "application/json"}),
        "A-raw": HttpRequest(
            host, port, "/invocations", raw, {"Content-Type": raw_type, CUSTOM_ATTRIBUTES: f"modelname={model}"}
        ),
    }


def _triton_datatype(array: Any) -> str:
    from app.core.spec import TRITON_TO_NUMPY

    return next(name for name, dtype in TRITON_TO_NUMPY.items() if dtype == array.dtype)


def peer_requests(host: str, port: int, tensors: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, HttpRequest]:
    """C-json (KServe v2 JSON) and C-binary (binary tensor extension, binary outputs) for the peer."""
    as_json = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": _triton_datatype(a), "data": a.ravel().tolist()}
            for n, a in tensors.items()
        ],
        "outputs": [{"name": o} for o in outputs],
    }
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "shape": list(a.shape),
                    "datatype": _triton_datatype(a),
                    "parameters": {"binary_data_size": a.nbytes},
                }
                for n, a in tensors.items()
            ],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        }
    ).encode()
    binary = header + b"".join(a.tobytes() for a in tensors.values())
    return {
        "C-json": HttpRequest(
            host, port, "/invocations", json.dumps(as_json).encode(), {"Content-Type": "application/json"}
        ),
        "C-binary": HttpRequest(host, port, "/invocations", binary, {"Content-Type": f"{BINARY_JSON}{len(header)}"}),
    }


def grpc_request(model: str, tensors: Mapping[str, Any], outputs: Sequence[str]) -> Any:
    """One ModelInferRequest, built once and sent as is by every B call."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in tensors.items():
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, _triton_datatype(array)
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(array.tobytes())
    for name in outputs:
        request.outputs.add().name = name
    return request
