"""The benchmark scripts run end to end on the CPU (tiny model).

`served.py` is driven on the H200 from the docs; the other scripts share its server and
client helpers, and twice a helper read a flag only `served.py` defines, so they failed at
start-up unnoticed. Each runs here briefly against a real `minipic serve`, or (the client's
overhead) against the mock server it builds, whose answers must keep up with the SDK's checks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import ServerPool

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parent.parent
PATHS = ("server_patch", "kernels", "sdk")  # what the docs put on PYTHONPATH for the client's overhead
SERVER_ARGS = ["--server-arg=--block-size=16", "--server-arg=--max-model-len=4096",
               "--server-arg=--kv-cache-memory-bytes=536870912", "--server-arg=--enforce-eager"]  # fmt: skip


@pytest.fixture(scope="module")
def passages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sixty short passages in the 2Wiki file's shape (title, text)."""
    path = tmp_path_factory.mktemp("passages") / "passages.json"
    words = "river town bridge station museum library harbour mill lake tower".split()
    rows = [{"title": f"Place {i}", "text": " ".join(words[(i + j) % 10] for j in range(40 + i % 30)) + "."}
            for i in range(60)]  # fmt: skip
    path.write_text(json.dumps(rows))
    return path


def run(script: str, *args: str, model: Path, passages: Path, out: Path) -> dict:
    command = [sys.executable, str(REPO / "benchmarks" / script), "--model", str(model), "--tokenizer", str(model),
               "--passages", str(passages), "--out", str(out), *SERVER_ARGS, *args]  # fmt: skip
    subprocess.run(command, check=True, cwd=REPO, timeout=600, capture_output=True)
    return json.loads(out.read_text())


def test_the_load_sweep_runs(server_pool: ServerPool, tiny_model_dir: Path, passages: Path, tmp_path: Path) -> None:
    with server_pool.exclusive():
        result = run("load_sweep.py", "--servers", "pic-256", "--rates", "4", "--seconds", "2", "--samples", "20",
                     model=tiny_model_dir, passages=passages, out=tmp_path / "load.json")  # fmt: skip
    (row,) = result["rates"]
    assert row["server"] == "pic-256" and row["completed"] > 0


def test_the_cached_ttft_profile_runs(server_pool: ServerPool, tiny_model_dir: Path, passages: Path,
                                      tmp_path: Path) -> None:  # fmt: skip
    with server_pool.exclusive():
        # MiniPIC's server only: a stock one would add a server start (~40 s) to a suite near its
        # 15 minutes; the plain prompts stock gets are `tests/test_sdk_client.py`'s to check.
        result = run("cached_ttft.py", "--docs", "1", "2", "--timed-requests", "4", "--no-profile", "--layout", "block",
                     "--servers", "pic-256", "--server-arg=--block-size=32",  # vLLM's CPU kernels' size
                     model=tiny_model_dir, passages=passages,
                     out=tmp_path / "ttft.json")  # fmt: skip
    one, two = result["rows"]
    assert [r["server"] for r in result["rows"]] == ["pic-256"] * 2
    assert (one["docs"], two["docs"]) == (1, 2) and two["prompt_tokens"] > one["prompt_tokens"]
    for row in result["rows"]:
        assert row["cached_tokens"] > row["prompt_tokens"] // 2
        # The server's stages nest inside the client's TTFT: scheduled -> first token, queued, arrival -> first token.
        assert 0 < row["server_prefill_s"] + row["server_queued_s"] <= row["server_first_token_s"]
        assert row["server_first_token_s"] < 2 * row["ttft_quartiles_s"][2]


def test_the_table1_token_counts_order_the_layouts(tiny_model_dir: Path, passages: Path, tmp_path: Path) -> None:
    """No server: Block-Attention takes the most of a final prompt from the cache and computes
    least, refreshed heads compute each passage's first block, the default also the first passage."""
    from tokenizers import Tokenizer

    from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN

    vocab = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).get_vocab()
    out = tmp_path / "counts.json"
    command = [sys.executable, str(REPO / "benchmarks" / "table1_layout_tokens.py"), "--passages", str(passages),
               "--tokenizer", str(tiny_model_dir), "--samples", "40", "--out", str(out),
               "--markers", *(str(vocab[t]) for t in (SSEP_TOKEN, PDEP_TOKEN, PAD_TOKEN, HSEP_TOKEN)),
               "--layout", "block", "refreshed-heads", "lead-text-repeat-refreshed-heads",
               "--kv-cache-tokens", "2000", "100000000"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["layouts"]
    block, refreshed, default = (rows[n] for n in ("block", "refreshed-heads", "lead-text-repeat-refreshed-heads"))
    assert block["final_cached_fraction"] > refreshed["final_cached_fraction"] > default["final_cached_fraction"]
    assert block["computed_per_sample"] < refreshed["computed_per_sample"] < default["computed_per_sample"]
    assert block["prefill_tokens_per_sample"] == pytest.approx(refreshed["prefill_tokens_per_sample"], rel=0.05)
    for row in rows.values():
        assert row["distinct_tokens_written"] == pytest.approx(40 * row["computed_per_sample"], abs=4)
        small, unlimited = (row["computed_per_sample_with_cache"][size] for size in ("2000", "100000000"))
        assert small > unlimited >= row["computed_per_sample"]  # evicted spans are computed again
    # Nothing evicted and no leading text: the replay computes what the count does.
    assert block["computed_per_sample_with_cache"]["100000000"] == block["computed_per_sample"]


def test_the_client_overhead_benchmark_runs(tiny_model_dir: Path) -> None:
    command = [sys.executable, str(REPO / "benchmarks" / "client_overhead.py"), "--model", str(tiny_model_dir),
               "--docs", "2", "--calls", "20", "--warmup", "2"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, timeout=300, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in PATHS)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"prompt: \d+ tokens \(2 docs, 3 prefills\)", done.stdout), done.stdout
    assert re.search(r"rag call +p50 [\d.]+ ms", done.stdout), done.stdout


@pytest.mark.parametrize("script, profile", [("served.py", ["--profile"]), ("cached_ttft.py", [])])
def test_a_profiling_run_without_py_spy_stops_before_any_server(script: str, profile: list[str], tmp_path: Path,
                                                                 passages: Path) -> None:  # fmt: skip
    """py-spy travels to the device only for profiling runs (`.whl-profile`): without it a run that
    profiles stops at once with one line, rather than after a server's start."""
    command = [sys.executable, str(REPO / "benchmarks" / script), "--model", "m", "--tokenizer", "m",
               "--passages", str(passages), "--out", str(tmp_path / "out.json"), *profile]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, timeout=120, capture_output=True, text=True,
                          env={**os.environ, "PATH": str(tmp_path)})  # no py-spy on it  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "py-spy is not installed: carry .whl-profile (bash tools/device-carry.sh) or profile nothing")
    assert not (tmp_path / "out.json").exists()
