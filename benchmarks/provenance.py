"""Where a result came from: commit (and whether the tree differed), versions, machine, command line.

Every results JSON carries this under ``"provenance"``. A device machine gets a copy of the
tree without git, so ``MINIPIC_COMMIT`` and ``MINIPIC_DIRTY`` (set by whoever sends the
tree) name the commit there.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
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


def provenance() -> dict[str, Any]:
    """Commit, dirty flag, date, argv, library versions, GPU (or "cpu") and CPU count."""
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
    }
