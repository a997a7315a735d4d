"""The command-line interface: the only package that imports typer and rich."""
