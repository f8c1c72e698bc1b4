"""The run directory: file names and their Arrow and JSON formats (:mod:`.files`), ``run.json``
(:mod:`.manifest`) and the readers of a run's data (:mod:`.read`). Every other module reads and
writes runs through these."""
