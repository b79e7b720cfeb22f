"""`benchmarks/pyspy_summary.py`: py-spy's raw stacks as per-process function shares."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import served
from cached_ttft import inclusive_samples
from pyspy_summary import summarise

RAW = "\n".join([
    'process 1:"python -m serve";process 2:"VLLM::EngineCore";run (vllm/core.py:10);step (vllm/core.py:20) 6',
    'process 1:"python -m serve";process 2:"VLLM::EngineCore";run (vllm/core.py:10);wait (x/attention.py:142) 2',
    'process 1:"python -m serve";main (api.py:5);handle (api.py:9) 3',
    'process 1:"python -m serve";main (api.py:5);f (api.py:9);f (api.py:9) 1',
])


def test_shares_are_per_process_and_count_a_frame_once_per_stack() -> None:
    summary = summarise(RAW, top=10)
    engine = summary["VLLM::EngineCore"]
    assert engine["samples"] == 8
    assert dict(engine["functions"]) == {
        "run (core.py:10)": 1.0, "step (core.py:20)": 0.75, "wait (attention.py:142)": 0.25
    }
    api = summary["api server (root process)"]
    assert api["samples"] == 4
    assert dict(api["functions"]) == {"main (api.py:5)": 1.0, "handle (api.py:9)": 0.75, "f (api.py:9)": 0.25}


def test_top_keeps_the_most_frequent_functions() -> None:
    assert [f for f, _ in summarise(RAW, top=1)["VLLM::EngineCore"]["functions"]] == ["run (core.py:10)"]


def test_a_stack_torn_by_sampling_without_pausing_is_skipped() -> None:
    """py-spy --nonblocking can read a stack mid-change: a line cut inside a frame name is left out."""
    torn = RAW + '\nprocess 1:"python -m serve";process 2:"VLLM::EngineCore";run (vllm/core.py:10);\xf0 ('
    assert summarise(torn, top=10) == summarise(RAW, top=10)


def test_the_cached_request_profile_skips_torn_stacks_too(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW + '\nprocess 1:"python -m serve";process 2:"VLLM::EngineCore";run (vllm/core.py:10);\xf0 (')
    engine = inclusive_samples(raw)["VLLM::EngineCore"]
    assert (engine["run"], engine["step"], engine["wait"]) == (8, 6, 2)


def test_a_py_spy_that_never_ends_its_window_is_stopped(tmp_path: Path, monkeypatch, capsys) -> None:
    """`served.profiled` stops py-spy once its window is long past (on the H100 it once fell
    hundreds of seconds behind and held a whole benchmark until the device call's limit)."""
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(served, "PYSPY_GRACE_S", 1)
    server = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        with served.profiled(server, tmp_path / "window.pyspy.txt", 0, True):
            pass
        assert time.monotonic() - started < 10
    finally:
        server.kill()
    assert "py-spy did not finish 0 s of sampling in 1 s: stopped, its profile (window.pyspy.txt) is lost" in (
        capsys.readouterr().err
    )
