"""`minipic batch` as a subprocess that signals itself right after its n-th result line.

Fault injection at a fixed point of a real run (other samples still in flight), so a test
that kills or stops the batch, or its server, mid-run does not race the run's speed.
"""

from __future__ import annotations

import signal
import sys

_PROGRAM = """
import os, sys
from minipic_client import batch, cli

after, signum = int(sys.argv[1]), int(sys.argv[2])
append = batch.ResultFile.append
written = 0

def append_then_signal(self, sample_id, result):
    global written
    append(self, sample_id, result)
    written += 1
    if written == after:
        os.kill(os.getpid(), signum)

batch.ResultFile.append = append_then_signal
sys.argv = ["minipic", *sys.argv[3:]]
cli.main()
"""


def batch_command(*args: str) -> list[str]:
    """`minipic batch ARGS` as this interpreter runs it."""
    return [sys.executable, "-m", "minipic_client.cli", "batch", *args]


def batch_signalling_itself(*args: str, after_results: int, signum: signal.Signals) -> list[str]:
    """`batch_command(*args)`, sending itself `signum` once `after_results` lines are written."""
    return [sys.executable, "-c", _PROGRAM, str(after_results), str(int(signum)), "batch", *args]
