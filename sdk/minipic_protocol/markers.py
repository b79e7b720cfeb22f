"""Marker roles: the four token ids a MiniPIC server publishes and its prompts carry.

SSep opens a span, HSep opens a span whose first block is hidden, PDep opens a block
that depends on the whole prompt before it, pad fills a segment to a block boundary.
Client, server and tests name them through this one table.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

# Field name -> the role's name in logs and messages, in publication order.
MARKER_ROLES: dict[str, str] = {
    "ssep_token_id": "SSep",
    "pdep_token_id": "PDep",
    "pad_token_id": "pad",
    "hsep_token_id": "HSep",
}


@dataclass(frozen=True)
class MarkerIds:
    """One server's marker ids (``hsep_token_id`` None: a tokenizer without a fourth unused
    special token, so the server serves no hidden heads)."""

    ssep_token_id: int
    pdep_token_id: int
    pad_token_id: int
    hsep_token_id: int | None = None

    @property
    def ids(self) -> tuple[int, ...]:
        """Every marker id that is set, in `MARKER_ROLES` order."""
        return tuple(i for i in astuple(self) if i is not None)

    @property
    def kind_ids(self) -> tuple[int, int, int | None]:
        """The ids that give a block a kind, as `minipic_protocol.blocks` takes them (pad gives none)."""
        return (self.ssep_token_id, self.pdep_token_id, self.hsep_token_id)
