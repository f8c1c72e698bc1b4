"""The package's version, alone in a module: what needs only the version (the CLI's --version,
the report's footer, the build) loads nothing else."""

__version__ = "0.3.0"
