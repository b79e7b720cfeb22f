"""Batch runs: a JSONL file of RAG samples through one client, resumable.

Each result is appended as one line and flushed as soon as its sample is done,
so a killed run loses at most the line being written. Re-running with the same
output cuts a truncated last line off, skips the ids already there and appends
the rest: every id ends up exactly once. The output is locked while a run
writes it, and a file that is not a result file is never changed.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout

from minipic_client.client import RagRequest, RagResult, SpanClient
from minipic_client.errors import (
    BatchInputError,
    InputFileError,
    InvalidDocumentError,
    MiniPICError,
    PromptError,
    RequestError,
)
from minipic_client.prompt import check_documents
from minipic_client.scheduler import Strategy
from minipic_client.tokens import unicode_problem

SampleId = str | int

# The fields every result line has, first "id" then "text" (json.dumps keeps this order):
# a file is a result file only when each of its lines has them all.
_RESULT_KEYS = ("id", "text", "ttft_s", "cached_tokens", "prompt_tokens")
_RESULT_START = b'{"id": '


@dataclass(frozen=True, slots=True)
class Sample:
    """One input line. `error`: its text cannot be tokenized, so it is reported, never sent."""

    id: SampleId
    request: RagRequest
    line: int
    error: BatchInputError | None = None


@dataclass(slots=True)
class BatchSummary:
    """What a run did; rates and percentiles cover this run's samples only.

    `prompt_tokens`: the final prompts' tokens; `cached_tokens`: their cache hits,
    the spans this run prefilled for them included; `computed_tokens`: what the
    server computed for the run, span prefills included (None: it reports no cache
    hits). The rest of the final prompts' tokens came from the cache (`reused_fraction`).
    """

    completed: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    computed_tokens: int | None = None
    ttfts_s: list[float] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def reused_fraction(self) -> float | None:
        if self.computed_tokens is None or not self.prompt_tokens:
            return None
        return max(self.prompt_tokens - self.computed_tokens, 0) / self.prompt_tokens

    def ttft_percentile(self, percent: int) -> float | None:
        if len(self.ttfts_s) < 2:
            return self.ttfts_s[0] if self.ttfts_s else None
        return statistics.quantiles(self.ttfts_s, n=100, method="inclusive")[percent - 1]


def read_samples(path: Path, *, max_tokens: int) -> list[Sample]:
    """Parse and check every line before anything is sent; errors name the line.

    A line that is not a sample stops the run (the file is probably wrong); a
    sample whose text is not valid Unicode gets a per-sample `error` instead.
    """
    samples: list[Sample] = []
    seen: dict[SampleId, int] = {}
    with _opened(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            bad_bytes: str | None = None
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                # Decoded anyway (bad bytes become lone surrogates) to learn the sample's id.
                line = raw.decode("utf-8", "surrogateescape")
                bad_bytes = not_utf8(exc)
            if not line.strip():
                continue
            try:
                sample_id, request, bad_text = _parse_sample(line, max_tokens)
            except ValueError as exc:
                raise BatchInputError(str(path), number, str(exc)) from None
            if sample_id in seen:
                raise BatchInputError(str(path), number, f"id {sample_id!r} already used on line {seen[sample_id]}")
            seen[sample_id] = number
            problem = bad_bytes or bad_text
            error = BatchInputError(str(path), number, problem) if problem else None
            sample = Sample(sample_id, request, number, error)
            samples.append(sample)
    return samples


def not_utf8(exc: UnicodeDecodeError) -> str:
    """A decoding error in words, naming the first bad byte and where it is."""
    return f"not valid UTF-8: byte {exc.object[exc.start]:#04x} at offset {exc.start}"


def _parse_sample(line: str, max_tokens: int) -> tuple[SampleId, RagRequest, str | None]:
    """One input line as a sample and what is wrong with its text, if anything;
    raises ValueError saying what else is wrong with it."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    sample_id = record.get("id")
    if not isinstance(sample_id, (str, int)) or isinstance(sample_id, bool):
        raise ValueError(f"'id' must be a string or an integer, got {sample_id!r}")
    system = record.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"'system' must be a string, got {type(system).__name__}")
    docs = record.get("docs", [])
    if not isinstance(docs, list):
        raise ValueError(f"'docs' must be a list of strings, got {type(docs).__name__}")
    task = record.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"'task' must be a non-empty string, got {task!r}")
    request = RagRequest(task=task, docs=docs, system=system, max_tokens=max_tokens)
    bad_text = _text_problem(system, docs, task)
    if bad_text is None:
        try:
            check_documents(docs)
        except InvalidDocumentError as exc:
            raise ValueError(f"'docs': {exc}") from None
    return sample_id, request, bad_text


def _text_problem(system: str | None, docs: list[Any], task: str) -> str | None:
    fields = [("system", system), *((f"docs[{i}]", d) for i, d in enumerate(docs)), ("task", task)]
    for name, text in fields:
        problem = unicode_problem(text) if isinstance(text, str) else None
        if problem is not None:
            return f"'{name}' {problem}"
    return None


class ResultFile:
    """A batch run's output: locked while open, and changed only once proven to be a
    result file (every complete line a result, a cut-short last line one's start).

    Use as a context manager; `done` holds the ids already there.
    """

    def __init__(self, path: Path, *, input_path: Path | None = None) -> None:
        self.path = path
        self._input = input_path
        self._lock = FileLock(f"{path}.lock", timeout=0)
        self._file: IO[bytes] | None = None
        self.done: set[SampleId] = set()

    def __enter__(self) -> ResultFile:
        path = str(self.path)
        if self._input is not None and _same_file(self.path, self._input):
            raise InputFileError(path, "is the input file: choose another --output")
        if not self.path.parent.is_dir():
            raise InputFileError(path, f"its folder {self.path.parent} does not exist")
        try:
            self._file = open(self.path, "a+b")  # read, checked and repaired below, then appended to
        except OSError as exc:
            raise InputFileError(path, f"cannot write it: {exc.strerror or exc}") from None
        try:
            self._acquire_lock()
            self._file.seek(0)
            self.done = _finished_ids(self.path, self._file)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _acquire_lock(self) -> None:
        try:
            self._lock.acquire()
        except Timeout:
            # filelock also times out when it cannot create the lock file at all.
            reason = (
                f"another run is writing it (lock {self._lock.lock_file})"
                if os.access(self.path.parent, os.W_OK)
                else f"cannot create its lock file {self._lock.lock_file}"
            )
            raise InputFileError(str(self.path), reason) from None

    def __exit__(self, *exc_info: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock.is_locked:
            self._lock.release()

    def pending(self, samples: Sequence[Sample]) -> list[Sample]:
        """The samples whose ids are not in the file yet; a file whose results are
        all of other samples is refused (another input's output)."""
        ids = {sample.id for sample in samples}
        if self.done and not self.done & ids:
            raise InputFileError(
                str(self.path), f"its {len(self.done)} results are all of other samples' ids: {_NOT_OURS_HINT}"
            )
        return [sample for sample in samples if sample.id not in self.done]

    def append(self, sample_id: SampleId, result: RagResult) -> None:
        """Write one result line and flush it: a kill loses at most this line."""
        assert self._file is not None, "ResultFile is not open"
        line = json.dumps(_record(sample_id, result), ensure_ascii=False) + "\n"
        self._file.write(line.encode("utf-8"))
        self._file.flush()


def _finished_ids(path: Path, f: IO[bytes]) -> set[SampleId]:
    """Ids in a result file. Every complete line must be a result; a last line
    without its newline must be a result (kept, the newline added) or the start of
    one that a kill cut short (cut off). Anything else is refused, the file unchanged."""
    data = f.read()
    end = data.rfind(b"\n") + 1
    done: set[SampleId] = set()
    for number, line in enumerate(data[:end].splitlines(), 1):
        done.add(_result_id(path, number, line))
    tail = data[end:]
    if not tail:
        return done
    number = data.count(b"\n") + 1
    try:
        json.loads(tail)
    except ValueError:  # not a whole JSON value: a line cut short, if it starts like one of ours
        if not _cut_short_result(tail, after_results=bool(done)):
            raise BatchInputError(str(path), number, _NOT_OURS) from None
        f.truncate(end)
        return done
    done.add(_result_id(path, number, tail))
    f.write(b"\n")
    return done


def _result_id(path: Path, number: int, line: bytes) -> SampleId:
    """The id of a result line; raises `BatchInputError` for any other line."""
    try:
        record = json.loads(line)
    except ValueError:
        raise BatchInputError(str(path), number, _NOT_OURS) from None
    missing = [key for key in _RESULT_KEYS if not isinstance(record, dict) or key not in record]
    if missing:
        fields = ", ".join(repr(key) for key in missing)
        raise BatchInputError(str(path), number, f"not a result line (no {fields}): {_NOT_OURS_HINT}")
    sample_id: SampleId = record["id"]
    return sample_id


def _cut_short_result(tail: bytes, *, after_results: bool) -> bool:
    """Whether `tail` is a result line a kill cut short. After proven result lines,
    any start of ``{"id": `` will do; alone in the file, it must reach ``"text": ``,
    which a sample line (id, then system/docs/task) never has there."""
    if not tail.startswith(_RESULT_START):
        return after_results and _RESULT_START.startswith(tail)
    text = tail.decode("utf-8", "replace")  # a kill may cut a character in two
    try:
        _, at = json.JSONDecoder().raw_decode(text, len(_RESULT_START))
    except ValueError:  # the id itself was cut short
        return after_results
    rest = text[at:]
    return rest.startswith(', "text": ') or (after_results and ', "text": '.startswith(rest))


_NOT_OURS_HINT = "is this the right --output file? (left unchanged)"
_NOT_OURS = f"not a result line: {_NOT_OURS_HINT}"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist (yet)
        return False


@contextmanager
def _opened(path: Path, mode: str) -> Iterator[IO[Any]]:
    """`open`, with an OS error as one line naming the file."""
    try:
        f = open(path, mode)
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read it: {exc.strerror or exc}") from None
    with f:
        yield f


async def run_batch(
    client: SpanClient,
    samples: Sequence[Sample],
    results: ResultFile | Path,
    *,
    strategy: Strategy = Strategy.ISPS,
    window: int | None = None,
    on_done: Callable[[Sample, RagResult | MiniPICError], None] | None = None,
) -> BatchSummary:
    """Run `samples`, appending one line per completed sample to `results` (an open
    `ResultFile`, or a path to open as one for this run).

    A sample whose text is bad, or that the server or the client rejects
    (`PromptError`, `RequestError`), is reported through `on_done` and left out of
    the output, so a re-run retries it. Anything else (the server unreachable
    after retries, a changed server) stops the run: every sample would fail the
    same way.
    """
    if isinstance(results, Path):
        with ResultFile(results) as opened:
            return await run_batch(client, samples, opened, strategy=strategy, window=window, on_done=on_done)
    summary = BatchSummary()
    started = time.perf_counter()
    computed_before = client.computed_tokens
    reports_cache = True
    sendable = []
    for sample in samples:
        if sample.error is None:
            sendable.append(sample)
            continue
        summary.failed += 1
        if on_done is not None:
            on_done(sample, sample.error)
    outcomes = client.rag_many((s.request for s in sendable), strategy=strategy, window=window)
    async with aclosing(outcomes):
        async for index, outcome in outcomes:
            sample = sendable[index]
            if isinstance(outcome, (PromptError, RequestError)):
                summary.failed += 1
            elif isinstance(outcome, MiniPICError):
                raise outcome
            else:
                results.append(sample.id, outcome)
                summary.completed += 1
                summary.prompt_tokens += outcome.prompt_tokens
                summary.cached_tokens += outcome.cached_tokens or 0
                reports_cache = reports_cache and outcome.cached_tokens is not None
                summary.ttfts_s.append(outcome.ttft_s)
            if on_done is not None:
                on_done(sample, outcome)
    summary.elapsed_s = time.perf_counter() - started
    # The client's count, not the samples' sum: `batched` sends a window's prefills for no one sample.
    summary.computed_tokens = client.computed_tokens - computed_before if reports_cache else None
    return summary


def _record(sample_id: SampleId, result: RagResult) -> dict[str, object]:
    return {
        "id": sample_id,
        "text": result.text,
        "ttft_s": round(result.ttft_s, 6),
        "cached_tokens": result.cached_tokens,
        "prompt_tokens": result.prompt_tokens,
        "computed_tokens": result.computed_tokens,
        "reused_tokens": result.reused_tokens,
    }

