"""What ``run.json`` keeps of a config field that can hold a secret: never the API key, a URL
without its credentials, an MCP server without its secret options. A field carries its rule as
metadata (:func:`kept_as`); ``RunConfig.public`` applies them and lists what lost something."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..telemetry.http import redact_url
from ..workload.mcp_tools import written


def never_kept(value: Any) -> None:
    return None


def url_kept(url: str | None) -> str | None:
    return None if url is None else redact_url(url)


def urls_kept(urls: list[str]) -> list[str]:
    return [redact_url(u) for u in urls]


def mcp_kept(specs: list[str]) -> list[str]:
    return [written(s) for s in specs]


def kept_as(write: Callable[[Any], Any]) -> dict[str, Any]:
    """Field metadata for a field that can hold a secret: ``run.json`` keeps only what ``write``
    makes of its value (nothing, for :func:`never_kept`); a value it changed is listed in ``withheld``,
    and a resumed run asks for that field again."""
    return {"kept_as": write}
