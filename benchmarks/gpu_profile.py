"""Where a served run's GPU time goes: vLLM's own torch profiler over a window of engine steps.

A server started with `server_flags` profiles the steps between ``POST /start_profile`` and
``POST /stop_profile`` (after skipping ``delay`` steps, at most ``steps`` of them) and writes
torch's operator table (``profiler_out_0.txt`` in vLLM 0.26, ``rank0.profiler_out.txt`` in
0.32), sorted by self CUDA time on a GPU (by self CPU time on a CPU-only server).
`read_table` turns it into data; the traces written beside it are deleted (hundreds of MB;
the table is what the results keep).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import httpx

_TIME = re.compile(r"^(?P<value>[\d.]+)(?P<unit>s|ms|us)$")
_UNIT_US = {"s": 1e6, "ms": 1e3, "us": 1.0}
TABLES = ("profiler_out_0.txt", "rank0.profiler_out.txt")  # vLLM 0.26, 0.32: rank 0's
# The range vLLM's GPU worker records around each profiled engine step (0.26 and 0.32):
# execute_context_<prefilling requests>(<their tokens>)_generation_<decoding requests>(<their tokens>).
_STEP = re.compile(r"^execute_context_(?P<prefilling>\d+)\((?P<prompt>\d+)\)_generation_\d+\((?P<generated>\d+)\)$")


def server_flags(directory: Path, delay: int, steps: int) -> list[str]:
    """``vllm serve`` flags (vLLM 0.26 and 0.32) for a torch profiler of ``steps`` engine steps
    after ``delay``, started and stopped over HTTP, its output in ``directory``."""
    config = {"profiler": "torch", "torch_profiler_dir": str(directory.resolve()), "torch_profiler_with_stack": False,
              "ignore_frontend": True, "delay_iterations": delay, "max_iterations": steps}  # fmt: skip
    return ["--profiler-config", json.dumps(config)]


def _microseconds(cell: str) -> float:
    match = _TIME.match(cell.strip())
    if match is None:
        raise ValueError(f"not a profiler time: {cell!r}")
    return float(match["value"]) * _UNIT_US[match["unit"]]


def read_table(text: str) -> dict:
    """The operator table as ``{"device": "CUDA"|"CPU", "total_us": ..., "ops": [{"name", "self_us",
    "calls"}, ...]}``, largest self time first: self CUDA time where the table has it, else self CPU."""
    lines = text.splitlines()
    rule = next((i for i, line in enumerate(lines) if line.startswith("-") and "  " in line), None)
    if rule is None:
        raise ValueError("not a torch profiler operator table: no rule of dashes above a header")
    spans = [m.span() for m in re.finditer(r"-+", lines[rule])]
    header = re.split(r"\s{2,}", lines[rule + 1].strip())  # a 13-letter title overflows its column
    device = "CUDA" if "Self CUDA" in header else "CPU"
    column = {name: header.index(name) for name in ("Name", f"Self {device}", "# of Calls")}
    ops = []
    for line in lines[rule + 3 :]:
        if line.startswith("-"):
            break
        cells = [line[a:b] for a, b in spans]
        ops.append({"name": cells[column["Name"]].strip(), "self_us": _microseconds(cells[column[f"Self {device}"]]),
                    "calls": int(cells[column["# of Calls"]])})  # fmt: skip
    total = next(line for line in lines if line.startswith(f"Self {device} time total:"))
    ops.sort(key=lambda op: -op["self_us"])
    return {"device": device, "total_us": _microseconds(total.split(":", 1)[1]), "ops": ops}


class Step(NamedTuple):
    prefilling_requests: int
    prompt_tokens: int
    generated_tokens: int
    gpu_us: float


def is_step(op: dict) -> bool:
    """Whether a row of the table is an engine step's range rather than an operator or kernel."""
    return _STEP.match(op["name"]) is not None


def steps_of(table: dict) -> list[Step]:
    """Every engine step the table shows, from the range vLLM records around each step (steps of
    the same size share one row of the table, their time summed)."""
    return [Step(int(m["prefilling"]), int(m["prompt"]), int(m["generated"]), op["self_us"] / op["calls"])
            for op in table["ops"] if (m := _STEP.match(op["name"])) for _ in range(op["calls"])]  # fmt: skip


def engine_steps(table: dict) -> dict:
    """The engine steps the table shows: how many, their GPU time, the prompt and generated tokens
    they computed; and the same for those that computed prompt tokens (not decode only). Two
    windows (stock's and MiniPIC's, or two commits') compare per computed token, since the steps
    they caught differ in size and mix."""
    steps = steps_of(table)
    prefills = [s for s in steps if s.prompt_tokens]
    return {"steps": len(steps), "gpu_us": sum(s.gpu_us for s in steps),
            "prompt_tokens": sum(s.prompt_tokens for s in steps),
            "generated_tokens": sum(s.generated_tokens for s in steps),
            "prefill_steps": len(prefills), "prefill_steps_gpu_us": sum(s.gpu_us for s in prefills)}  # fmt: skip


def _written_table(directory: Path) -> str | None:
    """The table's text once the worker has written all of it (it ends with the time totals)."""
    for path in map(directory.joinpath, TABLES):
        if path.is_file() and (text := path.read_text()).rstrip().endswith(("s", "ms", "us")):
            return text
    return None


async def start(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        (await http.post("/start_profile")).raise_for_status()


async def stop_and_read(url: str, directory: Path, timeout_s: float = 300) -> dict:
    """Stop the profiler (a no-op when it stopped itself after its steps), wait for its table,
    read it and clear the directory for the next window."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as http:
        (await http.post("/stop_profile")).raise_for_status()
    deadline = time.monotonic() + timeout_s
    while (text := _written_table(directory)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no profiler table ({' or '.join(TABLES)}) in {directory} within {timeout_s:.0f} s")
        await asyncio.sleep(1.0)
    table = read_table(text)
    shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return table
