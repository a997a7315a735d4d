"""`sparsetool simulate` (placeholder until implemented)."""

import typer


def simulate() -> None:
    """Not implemented yet."""
    typer.echo("error: 'simulate' is not implemented yet", err=True)
    raise typer.Exit(1)
