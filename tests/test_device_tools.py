"""tools/device-stage-halves.sh: the vLLM bundle's first part staged in two device calls."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(home))
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, check=False)


def test_the_two_halves_join_into_the_bundles_file(tmp_path: Path) -> None:
    bundle, home = tmp_path / "bundle", tmp_path / "home"
    (bundle / "a").mkdir(parents=True)
    whole = os.urandom(100_001)  # an odd size: the halves differ by one byte
    (bundle / "a" / "C.so.xz").write_bytes(whole)
    assert _run([str(ROOT / "tools/device-stage-halves.sh"), str(bundle)], home).returncode == 0
    halves = [(bundle / "a1" / "C.so.xz.1").read_bytes(), (bundle / "a2" / "C.so.xz.2").read_bytes()]
    assert len(halves[0]) == 50_001 and halves[0] + halves[1] == whole

    early = _run([str(bundle / "a2" / "stage.sh")], home)
    assert early.returncode != 0 and "half 1 is not staged" in early.stdout
    assert _run([str(bundle / "a1" / "stage.sh")], home).returncode == 0
    assert _run([str(bundle / "a2" / "stage.sh")], home).returncode == 0
    assert (home / ".minipic-device" / "C.so.xz").read_bytes() == whole
    assert not (home / ".minipic-device" / "C.so.xz.1").exists()


def test_a_corrupt_half_is_refused(tmp_path: Path) -> None:
    bundle, home = tmp_path / "bundle", tmp_path / "home"
    (bundle / "a").mkdir(parents=True)
    (bundle / "a" / "C.so.xz").write_bytes(os.urandom(4096))
    assert _run([str(ROOT / "tools/device-stage-halves.sh"), str(bundle)], home).returncode == 0
    (bundle / "a2" / "C.so.xz.2").write_bytes(b"\0" * 2048)
    assert _run([str(bundle / "a1" / "stage.sh")], home).returncode == 0
    joined = _run([str(bundle / "a2" / "stage.sh")], home)
    assert joined.returncode != 0 and "corrupt" in joined.stdout
    assert not (home / ".minipic-device" / "C.so.xz").exists()


def test_a_missing_bundle_is_named(tmp_path: Path) -> None:
    result = _run([str(ROOT / "tools/device-stage-halves.sh"), str(tmp_path / "nowhere")], tmp_path)
    assert result.returncode == 1 and "build the bundle first" in result.stdout
