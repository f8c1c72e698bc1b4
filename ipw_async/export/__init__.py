"""A finished run where its users already look: IPW's dataset layout, OpenTelemetry, MLflow.

Each exporter reads only the run directory (as ``analyze`` does), so a run finished by an
earlier version, or recovered after a kill, exports the same way. The integrations import
their SDKs inside the function that needs them: ``pip install ipw-async`` does not pull them.
"""

from __future__ import annotations


class ExportError(Exception):
    """An export cannot be made; the message says what to do (install an extra, fix a URL)."""
