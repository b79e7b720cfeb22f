"""The ``minipic`` command line.

Server commands import vLLM lazily, so the client-only install (no vLLM) can
still run ``minipic batch`` and ``minipic rag``.
"""

from __future__ import annotations

from typing import Optional

import typer

app = typer.Typer(
    help="MiniPIC: position-independent KV caching for vLLM.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from minipic_server import __version__

        typer.echo(f"minipic {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """MiniPIC command line."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def serve(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Model path or Hugging Face name."),
    ssep_token_id: Optional[int] = typer.Option(None, help="SSep marker id (default: from the tokenizer)."),
    pdep_token_id: Optional[int] = typer.Option(None, help="PDep marker id (default: from the tokenizer)."),
    pad_token_id: Optional[int] = typer.Option(None, help="Pad id (default: from the tokenizer)."),
) -> None:
    """Start vLLM's OpenAI-compatible server with PIC active. Other options go to vLLM."""
    from minipic_server.markers import MarkerIds
    from minipic_server.serve import serve_main

    given = (ssep_token_id, pdep_token_id, pad_token_id)
    if any(v is not None for v in given) and None in given:
        raise typer.BadParameter("give all three of --ssep-token-id, --pdep-token-id, --pad-token-id")
    markers = MarkerIds(*given) if None not in given else None
    serve_main(model, list(ctx.args), markers)


@app.command("make-tiny-model")
def make_tiny_model(
    directory: str = typer.Argument(..., help="Where to write the model."),
) -> None:
    """Write the embedded tiny Llama (random weights, offline tokenizer)."""
    from minipic_server.tiny_model import make_tiny_model as build

    path = build(directory)
    typer.echo(f"wrote tiny model to {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
