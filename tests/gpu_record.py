"""pytest plugin for `make test-gpu`: a JSON record of the run (commit, versions, GPU, outcomes).

The record goes to ``$MINIPIC_GPU_RECORD`` (default ``benchmarks/results/gpu-test-h200.json``).
A device copy of the tree has no git: ``MINIPIC_COMMIT`` and ``MINIPIC_DIRTY`` name the commit.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

_outcomes: dict[str, dict[str, object]] = {}
_started = time.time()


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _versions() -> dict[str, str | None]:
    import torch
    import triton
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"vllm": vllm.__version__, "torch": torch.__version__, "triton": triton.__version__, "gpu": gpu,
            "python": platform.python_version()}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0})
        entry["seconds"] = round(float(entry["seconds"]) + report.duration, 2)  # type: ignore[arg-type]
        if report.outcome != "passed":
            entry["outcome"] = f"{report.outcome} ({report.when})"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    status = _git("status", "--porcelain")
    record = {
        "commit": os.environ.get("MINIPIC_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": os.environ.get("MINIPIC_DIRTY", "1" if status else "0") == "1",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
        "exit_status": int(exitstatus),
        "seconds": round(time.time() - _started, 1),
        "versions": _versions(),
        "passed": sum(1 for o in _outcomes.values() if o["outcome"] == "passed"),
        "failed": sum(1 for o in _outcomes.values() if o["outcome"] != "passed"),
        "tests": _outcomes,
    }
    path = Path(os.environ.get("MINIPIC_GPU_RECORD", "benchmarks/results/gpu-test-h200.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
