"""`sparsetool report` (placeholder until implemented)."""

import typer


def report() -> None:
    """Not implemented yet."""
    typer.echo("error: 'report' is not implemented yet", err=True)
    raise typer.Exit(1)
