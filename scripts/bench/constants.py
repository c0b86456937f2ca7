"""Names and defaults every part of the benchmark shares."""

from __future__ import annotations

from app.core.settings import PROJECT_ROOT

DEFAULT_OUT = PROJECT_ROOT / "build" / "bench"
DEFAULT_IMAGE = PROJECT_ROOT / "build" / "samples" / "dog.jpg"
DEFAULT_TEXT = "The capital of France is [MASK]."
IDENTITY_TEXT = "hello [MASK] world."
MODELS = ("resnet", "yolov5", "bert_base")
CONCURRENCY = (1, 4, 8, 16)
IDENTITY = "identity"
# The identity model answering 40 ms later: the router's cost when its requests wait as a real model's do.
IDENTITY_WAIT, IDENTITY_WAIT_MS = "identity_wait", 40
NOBATCH_SUFFIX = "_nobatch"
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
START_TIMEOUT_S = 300.0
PERF_CONCURRENCY = 8
TRITON_SIDE, ROUTER_SIDE = "P-triton", "P-router"  # the two placements of an image pipeline (placement.py)
PYSTEP_SIDE = "P-pystep"  # a detector's Triton pipeline with NMS in a python step instead of its graph
# --quick, a smoke run of the text, generation and chat benchmarks: rounds, seconds a row, warm-up seconds a row.
QUICK_RUN = (1, 0.2, 0.1)
QUICK_HELP = f"smoke run: one round of {QUICK_RUN[1]:g} s rows, short warm-up"
