"""pytest plugin for `make test-gpu`: a JSON record of the run (commit, versions, GPU, outcomes).

The record goes to ``$MINIPIC_GPU_RECORD`` (default ``benchmarks/results/gpu-test-h200.json``).
A device copy of the tree has no git: ``MINIPIC_COMMIT`` and ``MINIPIC_DIRTY`` name the commit.
It is written again after every test, ``"complete": false`` until the session ends, so a run cut
short (a device call's time limit) still leaves the outcomes it reached.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import pytest

from provenance import provenance

_outcomes: dict[str, dict[str, object]] = {}
_started = time.time()
_provenance = functools.cache(provenance)  # once per run: it asks git and imports the frameworks


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0})
        entry["seconds"] = round(float(entry["seconds"]) + report.duration, 2)  # type: ignore[arg-type]
        if report.outcome != "passed":
            entry["outcome"] = f"{report.outcome} ({report.when})"
        _write(exit_status=None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write(exit_status=int(exitstatus))


def _write(exit_status: int | None) -> None:
    record = {
        **_provenance(),
        "complete": exit_status is not None,
        "exit_status": exit_status,
        "seconds": round(time.time() - _started, 1),
        "passed": sum(1 for o in _outcomes.values() if o["outcome"] == "passed"),
        "failed": sum(1 for o in _outcomes.values() if o["outcome"] != "passed"),
        "tests": _outcomes,
    }
    path = Path(os.environ.get("MINIPIC_GPU_RECORD", "benchmarks/results/gpu-test-h200.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(path)  # a run killed while writing leaves the previous record whole
