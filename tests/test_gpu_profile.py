"""`benchmarks/gpu_profile.py`: torch's operator table, as vLLM's profiler writes it, as data."""

from __future__ import annotations

import pytest
import tables
import torch
from gpu_profile import engine_steps, read_table, steps_of

# The table a GPU worker writes (`key_averages().table(sort_by="self_cuda_time_total")`), three
# rows, in torch's layout (`torch.autograd.profiler_util._build_table`: names right-aligned in
# 43 columns, every other column 12 wide, two spaces after each; "CUDA time avg" overflows).
_HEADERS = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA", "Self CUDA %",
            "CUDA total", "CUDA time avg", "# of Calls"]  # fmt: skip
_ROWS = [
    ["nvjet_sm90_tst_128x256_h", "0.00%", "0.000us", "0.00%", "0.000us", "0.000us", "1.250s", "61.20%", "1.250s",
     "312.500us", "4000"],
    ["_attention_kernel_0", "0.00%", "0.000us", "0.00%", "0.000us", "0.000us", "420.500ms", "20.59%", "420.500ms",
     "131.406us", "3200"],
    ["void flash_fwd_kernel<...>", "0.00%", "0.000us", "0.00%", "0.000us", "0.000us", "371.875ms", "18.21%",
     "371.875ms", "58.105us", "6400"],
]  # fmt: skip
_FORMAT = "{: >43}  " + "{: >12}  " * 10
_RULE = "-" * 43 + "  " + ("-" * 12 + "  ") * 10
CUDA_TABLE = "\n".join([_RULE, _FORMAT.format(*_HEADERS), _RULE, *(_FORMAT.format(*row) for row in _ROWS), _RULE,
                        "Self CPU time total: 2.100s", "Self CUDA time total: 2.042s", ""])  # fmt: skip


def test_a_cuda_table_gives_self_cuda_time_per_kernel() -> None:
    table = read_table(CUDA_TABLE)
    assert table["device"] == "CUDA"
    assert table["total_us"] == pytest.approx(2.042e6)
    assert [(op["name"], op["self_us"], op["calls"]) for op in table["ops"]] == [
        ("nvjet_sm90_tst_128x256_h", pytest.approx(1.25e6), 4000),
        ("_attention_kernel_0", pytest.approx(420500.0), 3200),
        ("void flash_fwd_kernel<...>", pytest.approx(371875.0), 6400),
    ]


def test_a_table_torch_prints_on_the_cpu_reads_back_as_its_events() -> None:
    """A real profile: the table's rows are torch's own per-operator totals, largest first."""
    a = torch.randn(128, 128)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(3):
            torch.softmax(a @ a, dim=-1)
    events = {e.key: e for e in profile.key_averages()}
    table = read_table(profile.key_averages().table(sort_by="self_cpu_time_total"))
    assert table["device"] == "CPU"
    names = [op["name"] for op in table["ops"]]
    assert {"aten::mm", "aten::_softmax"} <= set(names)
    assert [op["self_us"] for op in table["ops"]] == sorted((op["self_us"] for op in table["ops"]), reverse=True)
    for op in table["ops"]:
        assert op["calls"] == events[op["name"]].count
        assert op["self_us"] == pytest.approx(events[op["name"]].self_cpu_time_total, rel=1e-3, abs=1e-3)
    assert table["total_us"] == pytest.approx(sum(op["self_us"] for op in table["ops"]), rel=1e-2)


def test_a_text_without_a_table_is_refused() -> None:
    with pytest.raises(ValueError, match="not a torch profiler operator table"):
        read_table("no profile here\n")


def _ops(*rows: tuple[str, float, int]) -> dict:
    return {"ops": [{"name": name, "self_us": us, "calls": calls} for name, us, calls in rows]}


def test_engine_steps_add_up_the_step_ranges_and_their_tokens() -> None:
    """vLLM's worker names each step's range by what it computed; kernels and ops are not steps."""
    table = _ops(("aten::mm", 900.0, 64), ("execute_context_2(1000)_generation_30(30)", 500.0, 1),
                 ("execute_context_0(0)_generation_5(5)", 120.0, 4), ("_decode_kernel", 80.0, 64),
                 ("execute_context_1(8192)_generation_0(0)", 700.0, 1))  # fmt: skip
    assert engine_steps(table) == {"steps": 6, "gpu_us": 1320.0, "prompt_tokens": 9192, "generated_tokens": 50,
                                   "prefill_steps": 2, "prefill_steps_gpu_us": 1200.0}
    assert sorted(steps_of(table)) == [(0, 0, 5, 30.0)] * 4 + [(1, 8192, 0, 700.0), (2, 1000, 30, 500.0)]


def test_the_detailed_step_ranges_are_not_read_as_plain_ones() -> None:
    """With detailed trace annotations vLLM names a step by its lengths and compute instead
    (``execute_<tokens>_context_<requests>(sq..sk..sqsq..sqsk..)_generation_...``): not counted."""
    table = _ops(("execute_8192_context_1(sq8192sk8192sqsq67108864sqsk67108864)_generation_0(sq0sk0sqsq0sqsk0)",
                  700.0, 1))
    assert engine_steps(table) == {"steps": 0, "gpu_us": 0, "prompt_tokens": 0, "generated_tokens": 0,
                                   "prefill_steps": 0, "prefill_steps_gpu_us": 0}


def test_tables_print_a_window_without_step_ranges() -> None:
    """A CPU profile without vLLM's step ranges prints its operators, and says it has no step."""
    a = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        a @ a
    table = read_table(profile.key_averages().table(sort_by="self_cpu_time_total"))
    run = {"row": "r", "server": "s", "max_tokens": 1, "samples_per_s": 1.0, "computed_prompt_tokens_per_s": 9.0}
    lines = list(tables._gpu_profiles([{"server": "s", "row": "r", "max_tokens": 1, **table}], [run]))
    assert lines[0].endswith("no engine step that computed prompt tokens")
    assert any(line.startswith("| `aten::mm` |") and line.endswith("| - |") for line in lines)
