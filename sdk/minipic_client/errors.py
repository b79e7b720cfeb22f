"""The exceptions the client raises; catch `MiniPICError` for all of them.

The tree separates what retrying can fix (`ServerError`, `TransportError`: the
client already retried them) from what it cannot (`RequestError`, `PromptError`).
"""

from __future__ import annotations


class MiniPICError(Exception):
    """Base class of every error raised by `minipic_client`."""


class ConfigError(MiniPICError):
    """The server's setup does not fit this client (missing info, tokenizer, template)."""


class APIError(MiniPICError):
    """The server answered with an HTTP error; `message` is the server's own text."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message


class RequestError(APIError):
    """A 4xx other than 429: the request itself is wrong, so it is not retried."""


class ServerError(APIError):
    """A 5xx or 429: the server failed or is overloaded; raised once retries ran out."""


class TransportError(MiniPICError):
    """The connection failed or dropped; raised once retries ran out."""


class StreamInterruptedError(TransportError):
    """The connection dropped after the first chunk: not retried, output would repeat."""


class PromptError(MiniPICError, ValueError):
    """A prompt that cannot be sent; detected before anything goes to the server."""


class InvalidDocumentError(PromptError):
    """A document that is empty or not a string."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"document {index} {reason}")
        self.index = index


class PromptTooLongError(PromptError):
    """The laid-out prompt leaves no room for one generated token in max_model_len."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens (markers and padding included); "
            f"the server's max_model_len is {max_model_len}"
        )
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


class InputFileError(MiniPICError, ValueError):
    """A file named on the command line (a document, a batch input or output) that cannot be used."""

    def __init__(self, path: str, reason: str, line: int | None = None) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class BatchInputError(InputFileError):
    """A line of a batch input (or output, when resuming) that cannot be used."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(path, reason, line)
