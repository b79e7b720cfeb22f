"""Where an engine's configuration is created (API-server process): guards, the start-up log, metrics,
the detokenizer's priming.

This runs before the engine starts, so a configuration PIC cannot serve fails
with one message, and the operator sees one block saying what is active.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from minipic_protocol import MARKER_ROLES
from minipic_server.config import PicConfig, pic_config_of

logger = logging.getLogger("vllm.minipic")


def wrap_create_engine_config(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        from minipic_server import detokenizer_priming, metrics
        from minipic_server.guards import check_engine_config

        vllm_config = original(self, *args, **kwargs)
        pic = pic_config_of(vllm_config)
        if pic is not None:
            check_engine_config(vllm_config, pic)
            logger.info("%s", startup_block(vllm_config, pic))
            metrics.configure(pic, vllm_config.cache_config.block_size)
            detokenizer_priming.activate()
        return vllm_config

    return create_engine_config


def startup_block(vllm_config: Any, pic: PicConfig) -> str:
    """What an operator needs to see once: PIC is on, with which markers, blocks and attention."""
    from minipic_server import __version__
    from minipic_server.backend_selection import backend_for_platform
    from minipic_server.boundary import vllm_version

    model_config = vllm_config.model_config
    names = _marker_strings(model_config, pic)
    markers = ", ".join(
        f"{role} {token_id} {name!r}"
        for role, token_id, name in zip(MARKER_ROLES.values(), pic.marker_ids, names)
    )
    return "\n".join((
        f"MiniPIC {__version__}: position-independent caching ACTIVE",
        f"  vLLM {vllm_version()}, model {model_config.model}",
        f"  markers: {markers}",
        f"  block size {vllm_config.cache_config.block_size} tokens (spans are padded to it)",
        f"  attention backend {backend_for_platform()}",
    ))


def _marker_strings(model_config: Any, pic: PicConfig) -> list[str | None]:
    if model_config.skip_tokenizer_init:
        return [None] * len(pic.marker_ids)
    from minipic_server.markers import load_tokenizer

    tokenizer = load_tokenizer(model_config.tokenizer, model_config.tokenizer_revision, model_config.trust_remote_code)
    return list(tokenizer.convert_ids_to_tokens(list(pic.marker_ids)))
