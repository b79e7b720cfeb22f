"""The ``vllm.general_plugins`` entry point.

vLLM calls `register` in its API-server, engine-core and worker processes. It
checks that this vLLM release is one MiniPIC supports and installs the hooks of
`minipic_server.boundary` once per process; they cost nothing at import and
change behaviour only for engines whose ``additional_config`` holds a
``"minipic"`` section.
"""

from __future__ import annotations


def register() -> None:
    from minipic_server import boundary, lifetime

    lifetime.die_with_parent()
    boundary.install(boundary.supported_release())
