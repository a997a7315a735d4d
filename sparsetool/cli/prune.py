"""`sparsetool prune` (placeholder until implemented)."""

import typer


def prune() -> None:
    """Not implemented yet."""
    typer.echo("error: 'prune' is not implemented yet", err=True)
    raise typer.Exit(1)
