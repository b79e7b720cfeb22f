"""Where an engine's configuration is created (API-server process): the start-up guards.

This runs before the engine starts, so a configuration PIC cannot serve fails
with one message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minipic_server.config import pic_config_of


def wrap_create_engine_config(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        from minipic_server.guards import check_engine_config

        vllm_config = original(self, *args, **kwargs)
        pic = pic_config_of(vllm_config)
        if pic is not None:
            check_engine_config(vllm_config, pic)
        return vllm_config

    return create_engine_config
