"""A result's provenance names the knobs it ran under, not only its commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from results_io import read_result

from provenance import CODE_DIRS, ROOT, code_digest, commit_mismatch, knobs, provenance, record_of, tree_code


def test_knobs_are_the_minipic_and_vllm_variables_less_the_commit() -> None:
    environ = {"MINIPIC_FULL_CUDA_GRAPHS": "0", "VLLM_PLUGINS": "none", "MINIPIC_COMMIT": "abc1234",
               "MINIPIC_DIRTY": "0", "PATH": "/usr/bin", "XVLLM_OTHER": "1"}  # fmt: skip
    assert knobs(environ) == {"MINIPIC_FULL_CUDA_GRAPHS": "0", "VLLM_PLUGINS": "none"}


def test_a_result_records_the_knobs_it_ran_under(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIPIC_ATTN_SCRATCH_BYTES", "4096")
    monkeypatch.setenv("MINIPIC_COMMIT", "abc1234")
    record = provenance()
    assert record["commit"] == "abc1234"
    assert record["environment"]["MINIPIC_ATTN_SCRATCH_BYTES"] == "4096"
    assert "MINIPIC_COMMIT" not in record["environment"]


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True).stdout.strip()


def test_the_code_digest_checks_the_commit_typed_for_a_tree(tmp_path: Path) -> None:
    """A device run's commit is typed by hand: its code digest, taken from the files that ran,
    matches the commit that holds that code and no other; docs, caches and results do not count."""
    repo = tmp_path / "repo"
    for top in (*CODE_DIRS, "docs"):
        (repo / top).mkdir(parents=True)
        (repo / top / "a.py").write_text(f"# {top}\n")
    _git(repo, "init", "-q")
    for code in ("A = 1\n", "A = 2\n"):
        (repo / "server_patch" / "a.py").write_text(code)
        _git(repo, "add", ".")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", code)
    two = _git(repo, "rev-parse", "--short", "HEAD")
    (repo / "server_patch" / "__pycache__").mkdir()
    (repo / "server_patch" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    (repo / "docs" / "a.md").write_text("other docs\n")
    ran = {"commit": two, "dirty": False, "code_digest": code_digest(tree_code(repo))}
    assert commit_mismatch(ran, repo) is None
    assert commit_mismatch({**ran, "commit": "HEAD~1"}, repo) == "the code of commit HEAD~1 is not the code that ran"
    assert commit_mismatch({**ran, "commit": "0b6e25c"}, repo) == "commit 0b6e25c is not in this repository"
    assert commit_mismatch({**ran, "commit": "HEAD~1", "dirty": True}, repo) is None  # a dirty tree has no commit
    (repo / "kernels" / "a.py").write_text("B = 1\n")
    assert code_digest(tree_code(repo)) != ran["code_digest"]


def test_every_result_with_a_code_digest_names_the_commit_that_ran() -> None:
    """Results recorded since the digest (2026-12-07) whose commit was mistyped fail here, as
    `python benchmarks/provenance.py check` would have told."""
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json*")):
        assert commit_mismatch(record_of(read_result(path))) is None, path.name
