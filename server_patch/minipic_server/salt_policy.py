"""``require_cache_salt``: refuse completion and chat requests without a cache salt
(API-server process).

Unsalted requests share one prefix cache, and every answer reports
``usage.prompt_tokens_details.cached_tokens``: a caller can probe whether a
document sits in another caller's prompts by sending it and reading how much was
cached (with PIC a span hits at any offset, not only as a whole prefix). With the
option on, each tenant must send its own ``cache_salt``, and vLLM shares cached
blocks only between equal salts. docs/reliability.md describes the threat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from minipic_server.config import pic_config_of

MISSING_SALT = (
    "this server requires a 'cache_salt' on every request (minipic.require_cache_salt): "
    "send your tenant's own salt, e.g. SpanClient(url, cache_salt=...) or minipic batch --cache-salt"
)

Render = Callable[..., Awaitable[Any]]


def wrap_render(original: Render) -> Render:
    """`OnlineRenderer.render_completion` / `render_chat` / `render_responses`, answering 400
    when the engine requires a salt and the request has none (the hook is installed by
    `minipic_server.boundary`)."""

    async def render(self: Any, request: Any, **options: Any) -> Any:
        pic = pic_config_of(self.renderer.config)
        if pic is not None and pic.require_cache_salt and not request.cache_salt:
            return self.create_error_response(MISSING_SALT, param="cache_salt")
        return await original(self, request, **options)

    return render
