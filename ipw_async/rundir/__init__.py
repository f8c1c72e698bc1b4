"""The run directory: file names and their Arrow and JSON formats (:mod:`.files`), ``run.json``
(:mod:`.manifest`), the writer of a live run (:mod:`.writer`) and the one reader of a run
(:class:`RunDir`, :mod:`.read`). Every other module reads and writes runs through these."""

from .manifest import RunDirError
from .read import RunDir

__all__ = ["RunDir", "RunDirError"]
