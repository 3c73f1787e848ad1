"""The engram-sync command line: one module of typer commands per area."""
