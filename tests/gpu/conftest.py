"""The GPU suite runs only where it can run: `make test-gpu` on a CUDA machine with vLLM 0.26."""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    if not torch.cuda.is_available():
        raise pytest.UsageError("tests/gpu needs a CUDA GPU (run it with `make test-gpu` on the H200)")
