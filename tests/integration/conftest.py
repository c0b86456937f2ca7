"""A real Triton (the nvidia-pytriton binary) on the built test repository, shared by the modules
that speak to it over gRPC directly."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from scripts.devtools import start_triton


@pytest.fixture(scope="session")
def triton(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    triton = start_triton(repository, tmp_path_factory.mktemp("triton"))
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        triton.wait_ready(180)
        yield client
    finally:
        client.close()
        triton.stop()  # SIGTERM first: the python backend frees its shared memory
