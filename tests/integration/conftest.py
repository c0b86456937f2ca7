"""A real Triton (the nvidia-pytriton binary) on the built test repository, shared by the modules
that speak to it over gRPC directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.triton_calls import served


@pytest.fixture(scope="session")
def triton(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    with served(repository, tmp_path_factory.mktemp("triton")) as client:
        yield client
