"""`sparsetool densify` (placeholder until implemented)."""

import typer


def densify() -> None:
    """Not implemented yet."""
    typer.echo("error: 'densify' is not implemented yet", err=True)
    raise typer.Exit(1)
