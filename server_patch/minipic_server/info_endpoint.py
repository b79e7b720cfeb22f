"""``GET /minipic/info``: what a client needs to build PIC prompts for this server
(`minipic_protocol.ServerInfo`, the schema the client reads).

A ``vllm.endpoint_plugins`` entry point; vLLM loads it only when it is named in
``VLLM_PLUGINS`` (``minipic serve`` does that). It also puts `completions_route` in front of
vLLM's completion route, active where this info is.
"""

from __future__ import annotations

import os
import uuid
from argparse import Namespace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from minipic_protocol import ServerInfo
from minipic_server import __version__, completions_route
from minipic_server.boundary import vllm_version
from minipic_server.config import pic_config_of

ENDPOINT_PLUGIN_NAME = "minipic_info"


def server_info(vllm_config: Any, served_model_name: str, instance_id: str) -> ServerInfo:
    pic = pic_config_of(vllm_config)
    assert pic is not None
    return ServerInfo(
        model=served_model_name,
        tokenizer=_portable(vllm_config.model_config.tokenizer),
        block_size=vllm_config.cache_config.block_size,
        ssep_token_id=pic.ssep_token_id,
        pdep_token_id=pic.pdep_token_id,
        pad_token_id=pic.pad_token_id,
        hsep_token_id=pic.hsep_token_id,
        compact=pic.compact,
        span_bias=pic.span_bias,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        max_model_len=vllm_config.model_config.max_model_len,
        vllm_version=vllm_version(),
        minipic_version=__version__,
        instance_id=instance_id,
    )


def _portable(tokenizer: str) -> str:
    """A local tokenizer folder as an absolute path, readable by clients started anywhere on
    this machine; a Hugging Face name as it is."""
    return os.path.abspath(tokenizer) if os.path.isdir(tokenizer) else tokenizer


class InfoEndpointPlugin:
    name = ENDPOINT_PLUGIN_NAME
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter()

        @router.get("/minipic/info")
        async def minipic_info(request: Request) -> JSONResponse:
            info = _info(request)
            if info is None:
                return JSONResponse(
                    status_code=404,
                    content={"error": {"message": "MiniPIC is not active on this server"}},
                )
            return JSONResponse(info)

        app.include_router(router)
        completions_route.attach(app, active=lambda request: _info(request) is not None)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        vllm_config = state.vllm_config
        if engine_client is None or pic_config_of(vllm_config) is None:
            return
        names = getattr(args, "served_model_name", None) or [vllm_config.model_config.model]
        # A fresh id per server start tells clients that their span prefills are gone.
        state.minipic_info = server_info(vllm_config, names[0], uuid.uuid4().hex).to_json()


def _info(request: Request) -> dict[str, Any] | None:
    """The server's info, set once MiniPIC is active on the request's app."""
    return getattr(request.app.state, "minipic_info", None)
