"""Operating-system limits a run must fit in, checked (and raised where allowed) before it starts."""

from __future__ import annotations

from ..errors import RunError

# open files besides the connections: run files, telemetry devices, the simulator's pipes, DNS
SPARE_FILES = 64


def ensure_open_files(connections: int) -> str | None:
    """Make room for ``connections`` sockets: raise the soft open-file limit up to the hard one
    when it is too low (a note saying so), or stop with how to raise the hard limit."""
    try:
        import resource
    except ImportError:  # not a POSIX system: no such limit to check
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = connections + SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        raise RunError(
            f"{connections} connections need about {need} open files, but this process may open "
            f"only {hard}: raise the limit (e.g. `ulimit -n {need}` in the shell, or LimitNOFILE "
            "for a service) or lower --concurrency"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return f"raised the open-file limit from {soft} to {need} for {connections} connections"
