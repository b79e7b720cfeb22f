"""Shared fixtures: the embedded tiny model and one real server at a time."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from minipic_server.tiny_model import make_tiny_model

from servers import RunningServer, ServerPool, ServerSpec

PIC = ServerSpec()
# tests/gpu needs CUDA and vLLM 0.26: `make test-gpu` collects it, `make test` does not.
collect_ignore = [] if os.environ.get("MINIPIC_GPU_TESTS") == "1" else ["gpu"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the modules that use the default `pic_server` back to back, then the other server
    modules, then the unit tests: the pool keeps one server, so a module asking for another
    spec between two default ones costs a restart (half a minute on 2 cores), and the unit
    tests last find the Triton case run (started at collection) finished."""

    def rank(item: pytest.Item) -> int:
        module = module_ranks.get(item.path)
        return 2 if module is None else module

    module_ranks: dict[Path, int] = {}
    for item in items:
        if "pic_server" in getattr(item, "fixturenames", ()):
            module_ranks[item.path] = 0
        elif item.get_closest_marker("server") is not None:
            module_ranks.setdefault(item.path, 1)
    items.sort(key=rank)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the Triton kernel cases (one interpreter subprocess) as soon as they are collected:
    the server tests before them mostly wait on start-ups, so the run overlaps them."""
    if importlib.util.find_spec("triton") is None:
        return
    if any(item.path.name == "test_triton_kernel.py" for item in session.items):
        import test_triton_kernel as kernel_tests

        out_dir = Path(tempfile.mkdtemp(prefix="minipic-triton-cases-"))
        session.config.stash[kernel_tests.CASE_RUN] = kernel_tests.start_case_run(out_dir)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A case run nobody waited for (the session stopped early) does not outlive it."""
    import test_triton_kernel as kernel_tests

    run = session.config.stash.get(kernel_tests.CASE_RUN, None)
    if run is not None:
        run.process.kill()


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
