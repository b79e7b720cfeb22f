"""Where a result came from: commit (and whether the tree differed), versions, machine, command line.

Every results JSON carries this under ``"provenance"``. A device machine gets a copy of the
tree without git, so ``MINIPIC_COMMIT`` and ``MINIPIC_DIRTY`` (set by whoever sends the
tree) name the commit there, typed by hand; ``code_digest``, computed from the files that ran,
lets git check that name afterwards (``python benchmarks/provenance.py check RESULT...``). The
``MINIPIC_*`` and ``VLLM_*`` variables of the run go in too: they switch kernels, graphs and
plugins, so two results of one commit may differ by them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("server_patch", "kernels", "sdk", "benchmarks")  # what decides a result; docs and tests do not
CODE_SUFFIXES = (".py", ".sh")


def _git(*argv: str) -> str | None:
    try:
        return subprocess.run(["git", *argv], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _is_code(path: str) -> bool:
    return path.startswith(tuple(f"{d}/" for d in CODE_DIRS)) and path.endswith(CODE_SUFFIXES)


def code_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over (path, content) of the code files, in path order: the same for a checkout
    and for the commit it was made from, whatever else lies beside it."""
    digest = hashlib.sha256()
    for path, content in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


def tree_code(root: Path = ROOT) -> Iterator[tuple[str, bytes]]:
    """The code files of a checkout (no git needed: a device machine has none)."""
    for top in CODE_DIRS:
        for path in (root / top).rglob("*"):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and _is_code(relative):
                yield relative, path.read_bytes()


def commit_code(commit: str, root: Path = ROOT) -> list[tuple[str, bytes]] | None:
    """The code files of `commit` (from `git archive`), None where git does not know it."""
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit, "--", *CODE_DIRS],
                                 capture_output=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile() and _is_code(m.name)]


def record_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """Where a result keeps its provenance: ``provenance`` (benchmarks), ``meta`` (the accuracy
    harnesses) or the top level (`make test-gpu` records)."""
    return result.get("provenance") or result.get("meta") or result


def commit_mismatch(record: Mapping[str, Any], root: Path = ROOT) -> str | None:
    """Why `record`'s commit did not run the code its digest names, or None where it did (or
    where nothing can be checked: no digest, a dirty tree)."""
    if "code_digest" not in record or record.get("dirty") is not False:
        return None
    code = commit_code(str(record["commit"]), root)
    if code is None:
        return f"commit {record['commit']} is not in this repository"
    if code_digest(code) != record["code_digest"]:
        return f"the code of commit {record['commit']} is not the code that ran"
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
        "code_digest": code_digest(tree_code()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
        "versions": {name: _version(name) for name in ("vllm", "torch", "triton", "minipic_server")},
        "python": platform.python_version(),
        "device": gpu,
        "cpus": len(os.sched_getaffinity(0)),
        "environment": knobs(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Check that each result's commit ran the code its digest names.")
    parser.add_argument("command", choices=["check"])
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args()
    from results_io import read_result

    failed = False
    for path in args.results:
        problem = commit_mismatch(record_of(read_result(path)))
        failed |= problem is not None
        print(f"{path}: {problem or 'ok'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
