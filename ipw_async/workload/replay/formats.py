"""Timestamped request traces, read whole before a run starts: Mooncake, BurstGPT and Azure LLM
inference traces of single requests, and sessions (conversations whose turns follow each other).

Every format gives typed entries on one time base: ``offset_ns`` after the trace's earliest
entry, entries in time order. A line that cannot be read stops the reading with the file and
the line's number (``mooncake.jsonl line 17: ...``).

- **mooncake** (JSONL): ``{"timestamp": 27482, "input_length": 6955, "output_length": 52,
  "hash_ids": [46, 47, ...]}``: the timestamp in ms; each hash id is one block of
  :data:`MOONCAKE_BLOCK_TOKENS` prompt tokens, equal ids equal blocks (a shared prefix).
- **burstgpt** (CSV): ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``,
  the timestamp in seconds from the trace's start.
- **azure** (CSV, 2023 and 2024): ``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps like
  ``2023-11-16 18:15:46.6805900`` (2023: seven fractional digits, more than ``strptime`` takes)
  or ``2024-05-10 00:00:00.009930+00:00`` (2024: with its UTC offset).
- **sessions** (JSONL): one conversation a line, ``{"session_id": "s1", "timestamp": 12.5,
  "turns": [{"input_length": 900, "output_length": 120}, {"input_length": 60,
  "output_length": 200, "think_s": 8.0}]}``: the timestamp in seconds; a turn's
  ``input_length`` is its new user message, sent ``think_s`` after the previous answer ended
  with the turns before it as history.

A request that produced no tokens in the trace (BurstGPT's failures, a 0 output length), or
had no prompt, cannot be replayed: it is skipped and counted, by the column that was 0
(:attr:`Trace.skipped_by`), and the run says so (:meth:`Trace.skipped_note`).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..datasets import DatasetError, json_rows

MOONCAKE_BLOCK_TOKENS = 512
FORMATS = ("auto", "mooncake", "burstgpt", "azure", "sessions")
_MS, _S = 1_000_000, 1_000_000_000


@dataclass(frozen=True, slots=True)  # a trace can hold millions
class TraceRequest:
    """One request of a trace: when it arrived and its lengths in tokens."""

    offset_ns: int  # after the trace's first entry
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()  # shared-prefix block ids (Mooncake's hash_ids), in prompt order

    @property
    def offset_s(self) -> float:
        return self.offset_ns / _S


@dataclass(frozen=True, slots=True)  # a trace can hold millions
class SessionTurn:
    input_tokens: int  # the turn's new user message; the history comes on top
    output_tokens: int
    think_s: float = 0.0  # after the previous answer ended (a session's first turn: none)


@dataclass(frozen=True, slots=True)  # a trace can hold millions
class TraceSession:
    """One conversation of a sessions trace: it starts at ``offset_ns``."""

    session_id: str
    offset_ns: int
    turns: tuple[SessionTurn, ...]

    @property
    def offset_s(self) -> float:
        return self.offset_ns / _S


@dataclass(frozen=True)
class Trace:
    """A trace read whole: its requests, or its sessions (a sessions trace), in time order."""

    name: str  # the file's stem: the records' dataset
    format: str
    requests: tuple[TraceRequest, ...] = ()
    sessions: tuple[TraceSession, ...] = ()
    # entries skipped as producing nothing, by the column that was 0 (BurstGPT's failures)
    skipped_by: tuple[tuple[str, int], ...] = ()
    file: str = ""  # the file's name, as the run's note names it

    def __len__(self) -> int:
        return len(self.sessions) if self.format == "sessions" else len(self.requests)

    @property
    def skipped(self) -> int:
        return sum(n for _, n in self.skipped_by)

    def skipped_note(self) -> str | None:
        """The line a run prints once at its start when entries were skipped; None if none were."""
        if not self.skipped_by:
            return None
        if len(self.skipped_by) == 1:
            why = f"0 {self.skipped_by[0][0]}"
        else:
            why = ", ".join(f"{n} with 0 {column}" for column, n in self.skipped_by)
        requests = "request" if self.skipped == 1 else "requests"
        return f"skipped {self.skipped} failed {requests} of {self.file or self.name} ({why})"

    def describe(self) -> dict[str, Any]:
        """What run.json and summary.json say of the trace replayed."""
        return {
            "file": self.file or self.name,
            "format": self.format,
            "entries": len(self),
            "skipped": self.skipped,
            "skipped_by": dict(self.skipped_by),
        }


class _LineError(ValueError):
    """What is wrong with one line; the reader adds the file and the line's number."""


def _count(row: dict[str, Any], key: str, least: int = 0) -> int:
    if key not in row:
        raise _LineError(f"{key} is missing")
    value = row[key]
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _LineError(f"{key} must be a whole number of tokens, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        at_least = f" (at least {least})" if least else ""
        raise _LineError(f"{key} must be a whole number of tokens{at_least}, not {value!r}")
    return value


def _number(row: dict[str, Any], key: str, default: float | None = None) -> float:
    """A non-negative finite number; ``default`` where the key is absent (None: required)."""
    if key not in row:
        if default is None:
            raise _LineError(f"{key} is missing")
        return default
    value = row[key]
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _LineError(f"{key} must be a number, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
        raise _LineError(f"{key} must be a non-negative number, not {value!r}")
    return float(value)


# utf-8-sig: a file saved with a byte-order mark (Excel's CSVs) reads as one without
_ENCODING = "utf-8-sig"


def _csv_rows(path: Path, needed: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(encoding=_ENCODING, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in needed if c not in header]
        if missing:
            found = ", ".join(header) or "nothing"
            raise DatasetError(f"{path} line 1: no column {', '.join(missing)} (the header has {found})")
        for row in reader:
            # DictReader keeps surplus fields under the key None and fills short rows with None
            if None in row or None in row.values():
                extra = len(row.pop(None, None) or ())  # type: ignore[call-overload]
                fields = sum(v is not None for v in row.values()) + extra
                raise DatasetError(f"{path} line {reader.line_num}: {fields} fields where the header has {len(header)}")
            yield reader.line_num, row


Skipped = str  # an entry that cannot be replayed: the column that was 0
Entry = tuple[int, TraceRequest | TraceSession | Skipped]  # time (ns, the trace's clock) and what it is


def _request(at: int, row: dict[str, Any], lengths: tuple[str, str], blocks: tuple[int, ...] = ()) -> Entry:
    """A request at ``at`` with the input and output lengths of ``row``'s two columns; skipped
    (the column's name) when either is 0: the trace's failures (BurstGPT's), or nothing to send."""
    tokens_in, tokens_out = _count(row, lengths[0]), _count(row, lengths[1])
    if tokens_out == 0:
        return at, lengths[1]
    if tokens_in == 0:
        return at, lengths[0]
    return at, TraceRequest(at, tokens_in, tokens_out, blocks)


def _mooncake(n: int, row: dict[str, Any]) -> Entry:
    ids = row.get("hash_ids", [])  # optional: without it, no prompt shares a block
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise _LineError("hash_ids must be a list of whole numbers")
    at = round(_number(row, "timestamp") * _MS)
    return _request(at, row, ("input_length", "output_length"), tuple(ids))


def _burstgpt(n: int, row: dict[str, str]) -> Entry:
    at = round(_number(row, "Timestamp") * _S)
    return _request(at, row, ("Request tokens", "Response tokens"))


# 2023: 2023-11-16 18:15:46.6805900; 2024: 2024-05-10 00:00:00.009930+00:00
_AZURE_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")


def azure_time_ns(text: str) -> int:
    """An Azure trace's ``TIMESTAMP`` as ns since the epoch, every fractional digit kept
    (``datetime`` keeps six at most); no UTC offset (the 2023 trace) reads as UTC."""
    match = _AZURE_TIME.fullmatch(text.strip())
    if match is None:
        raise _LineError(
            f"TIMESTAMP must look like 2023-11-16 18:15:46.6805900 or 2024-05-10 00:00:00.009930+00:00, not {text!r}"
        )
    whole, fraction, offset = match.groups()
    try:
        stamp = dt.datetime.fromisoformat(whole + (offset or "+00:00"))
    except ValueError:
        raise _LineError(f"TIMESTAMP {text!r} is not a date and time that exists") from None
    return int(stamp.timestamp()) * _S + int((fraction or "").ljust(9, "0"))


def _azure(n: int, row: dict[str, str]) -> Entry:
    return _request(azure_time_ns(row["TIMESTAMP"]), row, ("ContextTokens", "GeneratedTokens"))


def _session(n: int, row: dict[str, Any]) -> Entry:
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        raise _LineError('expected "turns": a non-empty list of {"input_length", "output_length", "think_s"}')
    parsed = []
    for i, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise _LineError(f"turn {i} must be a JSON object")
        try:
            parsed.append(
                SessionTurn(
                    _count(turn, "input_length", 1),
                    _count(turn, "output_length", 1),
                    # a first turn is not waited for; a later one without its think time would
                    # be sent back to back, which is not what the trace says: required
                    _number(turn, "think_s", default=0.0 if i == 1 else None),
                )
            )
        except _LineError as exc:
            raise _LineError(f"turn {i}: {exc}") from None
    at = round(_number(row, "timestamp") * _S)
    session_id = row.get("session_id")
    return at, TraceSession(f"session-{n}" if session_id is None else str(session_id), at, tuple(parsed))


_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _rows(path: Path, fmt: str) -> Iterator[Entry]:
    parse: Callable[[int, Any], Entry]
    rows: Iterator[tuple[int, Any]]
    if fmt == "mooncake":
        rows, parse = json_rows(path, _ENCODING), _mooncake
    elif fmt == "sessions":
        rows, parse = json_rows(path, _ENCODING), _session
    elif fmt == "burstgpt":
        rows, parse = _csv_rows(path, _BURSTGPT_COLUMNS), _burstgpt
    else:
        rows, parse = _csv_rows(path, _AZURE_COLUMNS), _azure
    for n, row in rows:
        try:
            yield parse(n, row)
        except _LineError as exc:
            raise DatasetError(f"{path} line {n}: {exc}") from None


def detect(path: Path) -> str:
    """The trace format of ``path``, by its extension and its first line."""
    try:
        with path.open(encoding=_ENCODING) as f:
            first = next((line for line in f if line.strip()), "")
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not a text file; a trace is JSONL or CSV") from None
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and "turns" in row:
            return "sessions"
        if isinstance(row, dict) and "input_length" in row:
            return "mooncake"
    elif path.suffix.lower() == ".csv":
        header = next(csv.reader([first]), [])
        if all(c in header for c in _BURSTGPT_COLUMNS):
            return "burstgpt"
        if all(c in header for c in _AZURE_COLUMNS):
            return "azure"
    formats = ", ".join(FORMATS[1:])
    raise DatasetError(f"{path}: cannot tell its trace format from its first line; name it with --trace-format ({formats})")


def load_trace(path: str | Path, fmt: str = "auto") -> Trace:
    """A whole trace, in time order from its earliest entry; DatasetError names a bad line."""
    path = Path(path)
    if fmt not in FORMATS:
        raise DatasetError(f"--trace-format must be one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise DatasetError(f"trace file not found: {path}")
    if fmt == "auto":
        fmt = detect(path)
    entries = list(_rows(path, fmt))
    kept = [(at, item) for at, item in entries if not isinstance(item, str)]
    skipped = Counter(item for _, item in entries if isinstance(item, str))
    if not kept:
        raise DatasetError(f"{path}: no requests to replay" + (" (every one failed in the trace)" if entries else ""))
    origin = min(at for at, _ in entries)
    kept.sort(key=lambda e: e[0])  # stable: entries at one time keep the file's order
    timed = [dataclasses.replace(item, offset_ns=at - origin) for at, item in kept]
    requests = tuple(e for e in timed if isinstance(e, TraceRequest))
    sessions = tuple(e for e in timed if isinstance(e, TraceSession))
    return Trace(path.stem, fmt, requests, sessions, tuple(skipped.most_common()), path.name)
