"""MiniPIC's protocol, shared by the client, the server, the kernels and the tests.

Pure Python (no torch, no vLLM), so the client install carries it: the marker roles
(`markers`), the block rule in scalar form (`blocks`), the compact reading of a prompt
(`compact`) and the ``/minipic/info`` schema with its version (`info`). Each is defined here once.
"""

from minipic_protocol.blocks import (
    OUTSIDE_SPANS,
    BlockKind,
    block_kind_of,
    hidden_of_prompt,
    in_span,
    kinds_of_prompt,
    marker_kinds,
    opens_span,
    span_openers,
    visible,
    weighed_by_span_bias,
    window_starts_of_prompt,
)
from minipic_protocol.compact import (
    compact_positions_of_prompt,
    unread_ends_of_blocks,
    unread_of_prompt,
)
from minipic_protocol.info import PROTOCOL_VERSION, InfoError, ServerInfo
from minipic_protocol.markers import MARKER_ROLES, MarkerIds

__all__ = [
    "MARKER_ROLES",
    "OUTSIDE_SPANS",
    "PROTOCOL_VERSION",
    "BlockKind",
    "InfoError",
    "MarkerIds",
    "ServerInfo",
    "block_kind_of",
    "compact_positions_of_prompt",
    "hidden_of_prompt",
    "in_span",
    "kinds_of_prompt",
    "marker_kinds",
    "opens_span",
    "span_openers",
    "unread_ends_of_blocks",
    "unread_of_prompt",
    "visible",
    "weighed_by_span_bias",
    "window_starts_of_prompt",
]
