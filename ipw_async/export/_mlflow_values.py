"""Values made valid for MLflow and kept free of secrets: names, params, tags and artifacts
within its limits, credentials ``***`` in every value and text file."""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from ipw_async.export import ExportError
from ipw_async.rundir import files
from ipw_async.telemetry.http import redact_urls

MAX_ARTIFACT_BYTES = 50 * 1024 * 1024  # a longer traces.jsonl stays in the run directory
MAX_TAG_CHARS = 5000  # older servers' limit
MAX_KEY_CHARS = 250
TEXT_SUFFIXES = {".json", ".jsonl", ".csv", ".html", ".txt"}
# key names whose string value is a credential, also after a prefix ("hf_token", "x-api-key")
_SECRET_NAMES = ("api_key", "api-key", "apikey", "token", "secret", "password", "passwd", "authorization")
_SECRET_KEY = re.compile(rf"(?i)^(?:.*[_-])?(?:{'|'.join(map(re.escape, _SECRET_NAMES))})$")
_JSON_PAIR = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:\s*)"((?:[^"\\]|\\.)*)"')
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_\-. ]")  # MLflow also allows "/", which names files


def present(
    values: dict[str, Any], reasons: dict[str, str | None]
) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """The metrics that have a value (missing is not zero), and why each other one is missing."""
    metrics, missing = [], {}
    for key, value in values.items():
        if is_number(value):
            metrics.append((valid_name(key), float(value), 0))
        else:
            missing[valid_name(key)] = reasons.get(key) or f"null in {files.SUMMARY}"
    return metrics, missing


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested keys joined with dots, each value as text (see :func:`text`)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = text(str(key), value)
    return out


def text(key: str, value: Any) -> str:
    """A value as a param or tag: strings as they are, the rest as JSON; credentials redacted."""
    if _SECRET_KEY.match(key) and value not in (None, "") and not isinstance(value, bool):
        return "***"
    return _scrub(value if isinstance(value, str) else json.dumps(value, default=str))


def _scrub(text: str) -> str:
    """``text`` with each URL's secrets (:func:`redact_url`), and each JSON value under a
    credential's name, ``***``."""
    # each pattern costs about a second per 50 MB of traces, which rarely hold either: a URL
    # needs a "://", a credential's value a key ending in its name
    text = redact_urls(text)
    lower = text.lower()
    if any(f'{name}"' in lower for name in _SECRET_NAMES):
        text = _JSON_PAIR.sub(_redact_pair, text)
    return text


def _redact_pair(match: re.Match[str]) -> str:
    key, colon, value = match.groups()
    return f'"{key}"{colon}"***"' if value and _SECRET_KEY.match(key) else match.group()


def valid_name(key: str) -> str:
    """``key`` as a valid MLflow param, metric or tag name."""
    return _NOT_IN_NAME.sub("_", key)[:MAX_KEY_CHARS]


def limited(entries: dict[str, str], limit: int) -> tuple[dict[str, str], list[str]]:
    """Entries with valid names and values cut to ``limit`` characters; the names that were cut."""
    out, cut = {}, []
    for key, value in entries.items():
        if len(value) > limit:
            value = value[: limit - 3] + "..."
            cut.append(valid_name(key))
        out[valid_name(key)] = value
    return out, cut


def tags(notes: dict[str, str | None]) -> dict[str, str]:
    """The notes that have a value, redacted and within every server's tag limit."""
    present = {key: _scrub(value) for key, value in notes.items() if value is not None}
    return limited(present, MAX_TAG_CHARS)[0]


def flag(value: Any) -> str:
    return "true" if value else "false"


def folder(file: Path, root: Path) -> str | None:
    """The artifact directory mirroring ``file``'s place under ``root`` (None at the top)."""
    parent = file.parent.relative_to(root)
    return parent.as_posix() if parent.parts else None


def artifacts(
    found: list[tuple[Path, str | None]], work: Path
) -> tuple[list[tuple[Path, str | None]], dict[str, str]]:
    """The files to log, each text file from a redacted copy where it holds a credential; and
    those left out, with why."""
    out, skipped = [], {}
    for local, folder in found:
        size = local.stat().st_size
        if size > MAX_ARTIFACT_BYTES:
            label = f"{folder}/{local.name}" if folder else local.name
            skipped[label] = f"{size / 2**20:.0f} MiB, over the {MAX_ARTIFACT_BYTES // 2**20} MiB limit"
            continue
        out.append((_redacted(local, work), folder))
    return out, skipped


def _redacted(local: Path, work: Path) -> Path:
    """``local``, or a redacted copy of the same name where it holds a credential."""
    if local.suffix not in TEXT_SUFFIXES:
        return local
    text = local.read_text(encoding="utf-8", errors="surrogateescape")
    clean = _scrub(text)
    if clean == text:
        return local
    copy = Path(tempfile.mkdtemp(dir=work, prefix="redacted-")) / local.name
    copy.write_text(clean, encoding="utf-8", errors="surrogateescape")
    return copy


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = files.read_json(path)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} cannot be read: {brief(str(exc))}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} is not a JSON object")
    return data


def brief(text: str) -> str:
    """The first line of a message, redacted and at most 300 characters."""
    line = _scrub(text.strip().splitlines()[0] if text.strip() else "no message")
    return line if len(line) <= 300 else line[:297] + "..."

