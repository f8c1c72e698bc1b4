"""What a run raises: a one-sentence message a user can act on."""

from __future__ import annotations


class RunError(Exception):
    """The run cannot start or go on; the message says what to do."""


class RunAborted(RunError):
    """The run stopped early (the server went away); every record measured so far is on disk."""
