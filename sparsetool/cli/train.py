"""`sparsetool train` (placeholder until implemented)."""

import typer


def train() -> None:
    """Not implemented yet."""
    typer.echo("error: 'train' is not implemented yet", err=True)
    raise typer.Exit(1)
