"""MiniPIC's vLLM plugin: position-independent caching for an unmodified vLLM.

Loaded by vLLM through the ``vllm.general_plugins`` entry point
(`minipic_server.plugin.register`); inert unless the engine's
``additional_config`` holds a ``"minipic"`` section.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("minipic")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
