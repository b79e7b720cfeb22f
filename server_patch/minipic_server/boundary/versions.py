"""Which vLLM release this is, and whether MiniPIC supports it (one line when not)."""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Mapping

logger = logging.getLogger("vllm.minipic")

# The vLLM releases MiniPIC is checked on (major.minor), each with its platform and the
# module of `minipic_server.boundary` that holds what differs in it.
SUPPORTED_VLLM: Mapping[str, str] = {"0.26": "cuda", "0.32": "cpu"}
ALLOW_UNSUPPORTED_ENV = "MINIPIC_ALLOW_UNSUPPORTED_VLLM"


class UnsupportedVLLMError(RuntimeError):
    """This vLLM release is not one MiniPIC was checked on."""


def table_version(vllm_version: str, platform: str, environ: Mapping[str, str] = os.environ) -> str:
    """The `SUPPORTED_VLLM` release whose entries apply here.

    An unsupported release fails with one line unless `ALLOW_UNSUPPORTED_ENV` is
    set; then the entries of the release supported on this platform are used.
    """
    match = re.match(r"(\d+)\.(\d+)", vllm_version)
    minor = f"{match[1]}.{match[2]}" if match else vllm_version
    if SUPPORTED_VLLM.get(minor) == platform:
        return minor
    supported = ", ".join(f"vLLM {v}.x on {p}" for v, p in SUPPORTED_VLLM.items())
    fallback = next((v for v, p in SUPPORTED_VLLM.items() if p == platform), None)
    problem = f"MiniPIC supports {supported}; this is vLLM {vllm_version} on {platform}"
    if environ.get(ALLOW_UNSUPPORTED_ENV) != "1" or fallback is None:
        raise UnsupportedVLLMError(
            f"{problem}. Install a supported vLLM, or set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway"
            + ("" if fallback else f" (nothing is supported on {platform})")
        )
    _warn_once(f"{problem}: {ALLOW_UNSUPPORTED_ENV}=1 is set, so MiniPIC hooks it as vLLM {fallback}. "
               "UNTESTED: hooks may fail or answers may be wrong")
    return fallback


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)
