"""Batch runs: a JSONL file of RAG samples through one client, resumable.

Each result is appended as one line and flushed as soon as its sample is done,
so a killed run loses at most the line being written. Re-running with the same
output cuts a truncated last line off, skips the ids already there and appends
the rest: every id ends up exactly once.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

from minipic_client.client import RagRequest, RagResult, SpanClient
from minipic_client.errors import (
    BatchInputError,
    InvalidDocumentError,
    MiniPICError,
    PromptError,
    RequestError,
)
from minipic_client.prompt import check_documents
from minipic_client.scheduler import Strategy

SampleId = str | int


@dataclass(frozen=True, slots=True)
class Sample:
    id: SampleId
    request: RagRequest


@dataclass(slots=True)
class BatchSummary:
    """What a run did; rates and percentiles cover this run's samples only."""

    completed: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts_s: list[float] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft_percentile(self, percent: int) -> float | None:
        if len(self.ttfts_s) < 2:
            return self.ttfts_s[0] if self.ttfts_s else None
        return statistics.quantiles(self.ttfts_s, n=100, method="inclusive")[percent - 1]


def read_samples(path: Path, *, max_tokens: int) -> list[Sample]:
    """Parse and check every line before anything is sent; errors name the line."""
    samples: list[Sample] = []
    seen: dict[SampleId, int] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                sample = _parse_sample(line, max_tokens)
            except ValueError as exc:
                raise BatchInputError(str(path), number, str(exc)) from None
            if sample.id in seen:
                raise BatchInputError(
                    str(path), number, f"id {sample.id!r} already used on line {seen[sample.id]}"
                )
            seen[sample.id] = number
            samples.append(sample)
    return samples


def _parse_sample(line: str, max_tokens: int) -> Sample:
    """One input line as a sample; raises ValueError saying what is wrong with it."""
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
    try:
        check_documents(docs)
    except InvalidDocumentError as exc:
        raise ValueError(f"'docs': {exc}") from None
    task = record.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"'task' must be a non-empty string, got {task!r}")
    return Sample(sample_id, RagRequest(task=task, docs=docs, system=system, max_tokens=max_tokens))


def pending_samples(samples: Sequence[Sample], output: Path) -> list[Sample]:
    """The samples whose ids are not in `output` yet (repairing a truncated last line)."""
    done = _finished_ids(output)
    return [sample for sample in samples if sample.id not in done]


def _finished_ids(output: Path) -> set[SampleId]:
    if not output.exists():
        return set()
    with output.open("r+b") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)
    done: set[SampleId] = set()
    for number, line in enumerate(data[:end].splitlines(), 1):
        try:
            done.add(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            raise BatchInputError(
                str(output), number, "not a result line: is this the right --output file?"
            ) from None
    return done


async def run_batch(
    client: SpanClient,
    samples: Sequence[Sample],
    output: Path,
    *,
    strategy: Strategy = Strategy.ISPS,
    window: int | None = None,
    on_done: Callable[[Sample, RagResult | MiniPICError], None] | None = None,
) -> BatchSummary:
    """Run `samples`, appending one line per completed sample to `output`.

    A sample the server or the client rejects (`PromptError`, `RequestError`) is
    reported through `on_done` and left out of the output, so a re-run retries it.
    Anything else (the server unreachable after retries, a changed server) stops
    the run: every sample would fail the same way.
    """
    summary = BatchSummary()
    started = time.perf_counter()
    with output.open("a", encoding="utf-8") as out:
        outcomes = client.rag_many((s.request for s in samples), strategy=strategy, window=window)
        async with aclosing(outcomes):
            async for index, outcome in outcomes:
                sample = samples[index]
                if isinstance(outcome, (PromptError, RequestError)):
                    summary.failed += 1
                elif isinstance(outcome, MiniPICError):
                    raise outcome
                else:
                    out.write(json.dumps(_record(sample.id, outcome), ensure_ascii=False) + "\n")
                    out.flush()
                    summary.completed += 1
                    summary.prompt_tokens += outcome.prompt_tokens
                    summary.cached_tokens += outcome.cached_tokens or 0
                    summary.ttfts_s.append(outcome.ttft_s)
                if on_done is not None:
                    on_done(sample, outcome)
    summary.elapsed_s = time.perf_counter() - started
    return summary


def _record(sample_id: SampleId, result: RagResult) -> dict[str, object]:
    return {
        "id": sample_id,
        "text": result.text,
        "ttft_s": round(result.ttft_s, 6),
        "cached_tokens": result.cached_tokens,
        "prompt_tokens": result.prompt_tokens,
    }
