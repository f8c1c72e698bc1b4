"""What a run raises: a one-sentence message a user can act on."""

from __future__ import annotations

import signal


class RunError(Exception):
    """The run cannot start or go on; the message says what to do."""


class RunAborted(RunError):
    """The run stopped early (the server went away); every record measured so far is on disk."""


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM or SIGHUP) ended the work. A KeyboardInterrupt, so that
    whatever unwinds on Ctrl-C unwinds on each of them; commands exit with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"stopped by {self.signal.name}")


def stop_signal(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interruption: a plain KeyboardInterrupt is Ctrl-C's SIGINT."""
    return exc.signal if isinstance(exc, Stopped) else signal.SIGINT
