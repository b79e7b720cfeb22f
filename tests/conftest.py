"""Shared fixtures: the embedded tiny model and one real server at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from minipic_server.tiny_model import make_tiny_model

from servers import RunningServer, ServerPool, ServerSpec

PIC = ServerSpec()
# tests/gpu needs CUDA and vLLM 0.26: `make test-gpu` collects it, `make test` does not.
collect_ignore = [] if os.environ.get("MINIPIC_GPU_TESTS") == "1" else ["gpu"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def server_pool(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    pool = ServerPool(tiny_model_dir, tmp_path_factory.mktemp("server-logs"))
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def pic_server(server_pool: ServerPool) -> RunningServer:
    """`minipic serve` on the tiny model (float32, 16-token blocks)."""
    return server_pool.get(PIC)
