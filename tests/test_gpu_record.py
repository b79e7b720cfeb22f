"""`tests/gpu_record.py`: the GPU suite's record, also when the run is cut short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SUITE = '''
import os

def test_first():
    pass

def test_second():
    assert 1 == 2

def test_cut():
    if os.environ.get("CUT"):
        os._exit(3)  # as `timeout` kills a device call: no session end
'''


def _run(tmp_path: Path, cut: bool) -> tuple[int, dict]:
    (tmp_path / "test_suite.py").write_text(SUITE)
    record = tmp_path / "record.json"
    env = {**os.environ, "MINIPIC_GPU_RECORD": str(record), "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT / 'benchmarks'}",
           "MINIPIC_COMMIT": "abc1234", "MINIPIC_DIRTY": "0", "CUT": "1" if cut else ""}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_record",
                           str(tmp_path / "test_suite.py")], cwd=tmp_path, env=env, capture_output=True)  # fmt: skip
    return done.returncode, json.loads(record.read_text())


def test_a_finished_run_is_recorded_complete(tmp_path: Path) -> None:
    status, record = _run(tmp_path, cut=False)
    assert status == 1
    assert (record["complete"], record["exit_status"], record["passed"], record["failed"]) == (True, 1, 2, 1)
    assert record["tests"]["test_suite.py::test_second"]["outcome"] == "failed (call)"
    assert record["commit"] == "abc1234"


def test_a_run_cut_short_leaves_what_it_reached(tmp_path: Path) -> None:
    status, record = _run(tmp_path, cut=True)
    assert status == 3
    assert (record["complete"], record["exit_status"], record["passed"], record["failed"]) == (False, None, 1, 1)
    assert list(record["tests"]) == ["test_suite.py::test_first", "test_suite.py::test_second"]
