"""Where a result came from: commit (and whether the tree differed), versions, machine, command line.

Every results JSON carries this under ``"provenance"``. A device machine gets a copy of the
tree without git, so ``MINIPIC_COMMIT`` and ``MINIPIC_DIRTY`` (set by whoever sends the
tree) name the commit there. The ``MINIPIC_*`` and ``VLLM_*`` variables of the run go in too:
they switch kernels, graphs and plugins, so two results of one commit may differ by them.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any


def _git(*argv: str) -> str | None:
    try:
        return subprocess.run(["git", *argv], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


_KNOB_PREFIXES = ("MINIPIC_", "VLLM_")
_NOT_KNOBS = {"MINIPIC_COMMIT", "MINIPIC_DIRTY"}  # recorded as commit and dirty


def knobs(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment variables that may change what MiniPIC or vLLM computes, by name."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(_KNOB_PREFIXES) and k not in _NOT_KNOBS}


def provenance() -> dict[str, Any]:
    """Commit, dirty flag, date, argv, library versions, GPU (or "cpu"), CPU count and knobs."""
    commit = os.environ.get("MINIPIC_COMMIT") or _git("rev-parse", "HEAD")
    if "MINIPIC_DIRTY" in os.environ:
        dirty: bool | None = os.environ["MINIPIC_DIRTY"] == "1"
    else:
        status = _git("status", "--porcelain", "--untracked-files=no")
        dirty = None if status is None else bool(status)
    gpu = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {
        "commit": commit,
        "dirty": dirty,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
        "versions": {name: _version(name) for name in ("vllm", "torch", "triton", "minipic_server")},
        "python": platform.python_version(),
        "device": gpu,
        "cpus": len(os.sched_getaffinity(0)),
        "environment": knobs(),
    }
