"""tools/device-halves.sh: a file too large for one device call carried in two."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = str(ROOT / "tools/device-halves.sh")


def _run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(home))
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, check=False)


def _halves(tmp_path: Path, data: bytes, target: str) -> Path:
    source, out = tmp_path / "C.so.xz", tmp_path / "halves"
    source.write_bytes(data)
    assert _run([TOOL, str(source), target, str(out)], tmp_path / "home").returncode == 0
    return out


def test_the_two_halves_join_at_the_target_under_the_machines_home(tmp_path: Path) -> None:
    home, whole = tmp_path / "home", os.urandom(100_001)  # an odd size: the halves differ by one byte
    out = _halves(tmp_path, whole, "~/.minipic-device/C.so.xz")
    assert len((out / "1" / "part").read_bytes()) == 50_001
    assert (out / "1" / "part").read_bytes() + (out / "2" / "part").read_bytes() == whole
    early = _run([str(out / "2" / "stage.sh")], home)
    assert early.returncode != 0 and "is not on this machine" in early.stdout
    assert _run([str(out / "1" / "stage.sh")], home).returncode == 0
    assert _run([str(out / "2" / "stage.sh")], home).returncode == 0
    staged = home / ".minipic-device"
    assert (staged / "C.so.xz").read_bytes() == whole and not (staged / "C.so.xz.part1").exists()


def test_an_absolute_target_and_a_corrupt_half(tmp_path: Path) -> None:
    target = tmp_path / "machine" / "model.whl"
    out = _halves(tmp_path, os.urandom(4096), str(target))
    (out / "2" / "part").write_bytes(b"\0" * 2048)
    assert _run([str(out / "1" / "stage.sh")], tmp_path).returncode == 0
    joined = _run([str(out / "2" / "stage.sh")], tmp_path)
    assert joined.returncode != 0 and "joined corrupt" in joined.stdout and not target.exists()


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    missing = _run([TOOL, str(tmp_path / "nowhere"), "/tmp/x", str(tmp_path / "out")], tmp_path)
    assert missing.returncode == 1 and "no file" in missing.stdout
    (tmp_path / "f").write_bytes(b"x")
    relative = _run([TOOL, str(tmp_path / "f"), "relative/x", str(tmp_path / "out")], tmp_path)
    assert relative.returncode == 2 and "absolute path" in relative.stdout
    assert _run([TOOL], tmp_path).returncode == 2
