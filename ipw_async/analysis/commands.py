"""CLI commands for analysis (analyze, plot, sweep, compare), registered on the main app."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the analysis commands to ``app``."""
