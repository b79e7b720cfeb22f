"""The Triton paged RoPE attention kernel against the torch reference, on the CPU.

The kernel runs under the Triton interpreter (``TRITON_INTERPRET=1``). That variable
must be set before Triton is first imported and would leak into every other test
module of this pytest process (vLLM imports Triton too), so the cases run in ONE
subprocess per module (`tests/triton_kernel_cases.py`), which prints a JSON line per
case; each test below checks one line. fp32 and fp16 only: the interpreter computes
bf16 ``tl.dot`` wrongly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPER = ROOT / "tests" / "triton_kernel_cases.py"
CASE_RUN = pytest.StashKey["CaseRun"]()

CASE_NAMES = [
    "f32_neox_bs16_g1",
    "f32_gptj_bs16_g2",
    "f32_neox_bs32_g4",
    "f32_partial_neox",
    "f32_partial_gptj",
    "f16_neox_g4_d128",
    "f16_gptj_bs32_g2",
    "f32_dup_block",
    "f32_plain_windows",
    "f32_group3_padded",
    "f32_wide_tiles",
    "f32_decode_splits",
    "f32_decode_one_block_per_tile",
    "f32_decode_only",
    "f32_default_configs",
    "f16_default_configs_d128",
    "f32_dense_over_budget",
    "f16_dense_over_budget_dup_partial",
    "f32_all_at_origin",
    "f32_all_misplaced",
    "f32_dense_mixed",
    "f32_dense_plain",
    "f16_dense_gptj_dup",
    "f32_short_table",
    "f32_host_upper_bounds",
    "f32_hidden_tiles",
    "f16_hidden_tiles_g4",
    "f32_hidden_at_origin",
    "f32_hidden_decode_splits",
    "f32_hidden_dense",
    "f32_hidden_dense_at_origin",
    "f32_hidden_default_configs",
    "f32_refreshed_heads_at_origin",
    "f32_refreshed_heads_moved_gptj",
    "f16_refreshed_heads_partial_g4",
    "f32_refreshed_heads_host_upper_bounds",
    "f32_refreshed_heads_over_budget",
    "f32_hidden_heads_dense",
    "f32_decode_one_hidden",
    "f16_decode_one_hidden_bs32",
    "f32_moved_decode_neox",
    "f32_moved_decode_gptj",
    "f16_moved_decode_neox_d128",
    "f32_moved_decode_partial_neox",
    "f32_moved_decode_partial_gptj",
    "f32_moved_decode_head80",
    "f32_compact_tiles",
    "f32_compact_tails_at_origin",
    "f32_compact_decode_splits",
    "f16_compact_partial_gptj_bs32",
    "f32_compact_dense",
    "f32_compact_tails_dense_at_origin",
    "f32_compact_partial_neox",
    "f16_compact_gptj_d128",
    "f32_span_bias_tiles",
    "f32_span_bias_decode_splits",
    "f32_span_bias_refreshed_heads_dense",
    "f32_span_bias_compact_final_prompts_dense",
    "f16_span_bias_compact_d128",
    "compact_query_rotation_f32_compact_tiles",
    "compact_query_rotation_f16_compact_gptj_d128",
    "compact_query_rotation_f16_compact_partial_gptj_bs32",
    "hidden_flag_gates_the_mask",
    "refreshed_heads_on_the_stock_kernel",
    "compact_tails_on_the_stock_kernel",
    "f32_compact_final_prompts_at_origin",
    "f32_compact_final_prompts_moved_gptj",
    "f16_compact_final_prompts_partial_g4",
    "f32_compact_final_prompts_host_upper_bounds",
    "compact_final_prompts_on_the_stock_kernel",
    "rotate_into_pages_compact",
    "write_kv",
    "write_kv_gptj",
    "write_then_attend_float32_dense",
    "write_then_attend_float16_dense",
    "write_then_attend_float32_tiles_gptj",
    "write_then_attend_float32_reference",
    "decode_over_rotated_keys",
    "step_derivation",
]


@dataclass
class CaseRun:
    """The case runner started in the background: its process and where it writes."""

    process: subprocess.Popen
    stdout: Path
    stderr: Path


def start_case_run(out_dir: Path) -> CaseRun:
    """Start the interpreter's case run (about three minutes on 2 cores). conftest.py starts it
    as soon as this module's tests are collected, so it overlaps the tests before them."""
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    paths = [str(ROOT / "kernels"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    stdout, stderr = out_dir / "triton-cases.out", out_dir / "triton-cases.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen([sys.executable, str(HELPER), *CASE_NAMES, "warm_up_coverage"],
                                   cwd=ROOT, env=env, stdout=out, stderr=err)  # fmt: skip
    return CaseRun(process, stdout, stderr)


@pytest.fixture(scope="module")
def case_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    pytest.importorskip("triton")
    run = request.config.stash.get(CASE_RUN, None) or start_case_run(tmp_path_factory.mktemp("triton"))
    try:
        returncode = run.process.wait(timeout=600)
    finally:
        run.process.kill()
    results = {}
    for line in run.stdout.read_text().splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["name"]] = row
    if not results:
        pytest.fail(f"case runner failed (rc={returncode}):\n{run.stderr.read_text()[-4000:]}")
    return results


@pytest.mark.parametrize("name", CASE_NAMES)
def test_kernel_matches_reference(case_results: dict[str, dict], name: str) -> None:
    assert name in case_results, f"case {name} produced no result"
    row = case_results[name]
    assert row["ok"], f"{name}: max_err={row['max_err']} tol={row.get('tol')} {row.get('detail', '')}"


def test_warm_up_launches_every_variant_that_serving_steps_launch(case_results: dict[str, dict]) -> None:
    """No kernel compiles after start-up: random steps (decodes, short queries, prefills,
    chunks, windows, over and under the scratch budget, with and without a stock kernel
    for window-free prefill) launch no specialisation `warm_up` did not."""
    row = case_results.get("warm_up_coverage")
    assert row is not None, "the warm-up coverage check produced no result"
    assert row["variants_stepped"] > 0
    assert row["ok"], f"variants launched after warm-up: {row['missing']}"

