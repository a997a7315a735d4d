"""`sparsetool flops` (placeholder until implemented)."""

import typer


def flops() -> None:
    """Not implemented yet."""
    typer.echo("error: 'flops' is not implemented yet", err=True)
    raise typer.Exit(1)
