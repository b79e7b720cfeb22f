"""Result files under benchmarks/results/: JSON, gzip-compressed (``.json.gz``) where a run's
per-question answers would make the file too large to commit or to carry to a device call."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def read_result(path: Path) -> Any:
    """The JSON document at `path`, decompressed first when its name ends in ``.gz``."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def write_result(path: Path, document: Any) -> None:
    """Write `document` as ``accuracy.py`` always has (one-space indent), gzip-compressed when
    `path` ends in ``.gz`` (fixed mtime, so the same document gives the same bytes)."""
    text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def result_stem(path: Path) -> str:
    """The file's name without ``.json`` or ``.json.gz``: what its figures are named after."""
    return path.name.removesuffix(".gz").removesuffix(".json")
