"""Build MiniPIC's wheel the way the README says (`python -m build`), from a copy of the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info")


def build_wheel(root: Path) -> Path:
    """The wheel, built under `root` (setuptools writes into the source tree: the checkout stays clean)."""
    source = root / "source"
    for package_dir in ("server_patch", "kernels", "sdk"):
        shutil.copytree(REPO / package_dir, source / package_dir, ignore=IGNORED)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    argv = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(root / "dist"), str(source)]
    built = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"python -m build failed:\n{built.stdout[-2000:]}\n{built.stderr[-2000:]}"
    (wheel,) = (root / "dist").glob("minipic-*-py3-none-any.whl")
    return wheel
