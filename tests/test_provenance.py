"""A result's provenance names the knobs it ran under, not only its commit."""

from __future__ import annotations

import pytest

from provenance import knobs, provenance


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
