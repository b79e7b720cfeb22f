"""benchmarks/results_io.py: result files read and written alike, plain or gzip-compressed."""

from __future__ import annotations

import gzip
from pathlib import Path

from results_io import read_result, result_stem, write_result

DOCUMENT = {"schema": "minipic-accuracy/2", "answers": ["Zac Dysert was born in 1990.", "Jänner"], "n": 3}


def test_a_compressed_result_reads_back_as_the_plain_one(tmp_path: Path) -> None:
    plain, packed = tmp_path / "run.json", tmp_path / "run.json.gz"
    write_result(plain, DOCUMENT)
    write_result(packed, DOCUMENT)
    assert read_result(plain) == read_result(packed) == DOCUMENT
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()  # the same text, compressed
    first = packed.read_bytes()
    write_result(packed, DOCUMENT)
    assert packed.read_bytes() == first  # no timestamp inside: the same document, the same bytes


def test_figures_are_named_after_the_result_without_its_suffixes() -> None:
    assert result_stem(Path("results/accuracy-families-smollm2-h200.json.gz")) == "accuracy-families-smollm2-h200"
    assert result_stem(Path("accuracy-families-smollm2-cpu.json")) == "accuracy-families-smollm2-cpu"


PLAIN_RESULT_LIMIT = 150_000  # bytes; every device call carries the tracked tree beside vLLM's 54 MiB bundle


def test_large_results_are_committed_compressed() -> None:
    """A device call carries at most 64 MiB, vLLM's first bundle part takes 54 of them and the
    tracked tree travels with it: large result files go in compressed (`write_result` to a
    ``.json.gz`` name)."""
    results = Path(__file__).resolve().parents[1] / "benchmarks/results"
    large = [p.name for p in results.glob("*.json") if p.stat().st_size > PLAIN_RESULT_LIMIT]
    assert not large, f"result files over {PLAIN_RESULT_LIMIT:,} bytes, commit them as .json.gz: {large}"
