"""`minipic serve`'s engine and worker processes end with the process that started them.

vLLM stops its engine-core and worker processes when the API server shuts down,
but a ``kill -9`` of the API server leaves them running, holding the model and
the KV cache. ``minipic serve`` marks itself in the environment; every vLLM
process it starts (directly or through the engine core) asks the kernel, when
the plugin registers, for SIGKILL as soon as its parent dies, and marks itself
in turn for its own children.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "MINIPIC_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def children_die_with_this_process() -> None:
    """Make the vLLM processes started from here die with this process (Linux)."""
    os.environ[PARENT_ENV] = str(os.getpid())


def die_with_parent() -> None:
    """In a vLLM process started by a marked one: die with it. Idempotent."""
    marked = os.environ.get(PARENT_ENV)
    if marked is None or int(marked) == os.getpid() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(marked):
        # The parent died before the signal was armed: nobody is left to serve.
        os.kill(os.getpid(), signal.SIGKILL)
    children_die_with_this_process()
