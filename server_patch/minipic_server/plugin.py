"""The ``vllm.general_plugins`` entry point.

vLLM calls `register` in its API-server, engine-core and worker processes. Each
hook is installed once, costs nothing at import, and changes behaviour only for
engines whose ``additional_config`` holds a ``"minipic"`` section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minipic_server.config import pic_config_of
from minipic_server.patching import wrap_attribute


def register() -> None:
    from minipic_server import backend_selection, engine_hooks, lifetime, marker_text, position_free, warmup_hook

    lifetime.die_with_parent()
    _install_config_guards()
    marker_text.install()
    engine_hooks.install()
    position_free.install()
    backend_selection.install()
    warmup_hook.install()


def _install_config_guards() -> None:
    """Check the configuration where it is created, so a bad setup fails before the engine starts."""
    from vllm.engine.arg_utils import EngineArgs

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def create_engine_config(self: EngineArgs, *args: Any, **kwargs: Any) -> Any:
            from minipic_server.guards import check_engine_config

            vllm_config = original(self, *args, **kwargs)
            pic = pic_config_of(vllm_config)
            if pic is not None:
                check_engine_config(vllm_config, pic)
            return vllm_config

        return create_engine_config

    wrap_attribute(EngineArgs, "create_engine_config", wrap)
