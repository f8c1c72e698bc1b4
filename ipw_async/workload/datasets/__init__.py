"""Queries to send: the built-in QA set, a synthetic length-controlled set, and user files."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._qa_facts import CAPITALS, ELEMENTS, GENERAL

if TYPE_CHECKING:
    import polars as pl


class DatasetError(Exception):
    """A dataset could not be used; the message names the file and, where it can, the row."""


@dataclass(frozen=True)
class Query:
    id: str
    prompt: str
    reference: str | None = None
    max_tokens: int | None = None  # overrides the run's --max-tokens (synthetic lengths)
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    name: str
    queries: list[Query]
    scorer: str | None = None  # the default scorer for its answers (see ipw_async.scoring)
    # stop sequences a few-shot prompt needs so a base model answers one line only
    stop: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.queries)


# -- built-in QA ----------------------------------------------------------------------------

FEW_SHOT = (
    "Answer each question with a short answer.\n\n"
    "Q: What is 2 + 2?\nA: 4\n\n"
    "Q: What is the capital of Scotland?\nA: Edinburgh\n\n"
    "Q: What is the chemical symbol for boron?\nA: B\n\n"
)


def qa_prompt(question: str) -> str:
    """The few-shot form a base model answers on /v1/completions (stop at newline)."""
    return f"{FEW_SHOT}Q: {question}\nA:"


def question_of(prompt: str) -> str | None:
    """The question a QA prompt asks (the last ``Q:`` line), or None for another prompt."""
    start = prompt.rfind("\nQ: ")
    if start < 0 or not prompt.endswith("\nA:"):
        return None
    return prompt[start + 4 : -3]


def qa_pairs() -> list[tuple[str, str]]:
    """The built-in (question, answer) pairs, deterministic."""
    pairs = [(f"What is the capital of {country}?", city) for country, city in CAPITALS]
    pairs += [(f"What is the chemical symbol for {name}?", symbol) for name, symbol in ELEMENTS]
    pairs += list(GENERAL)
    rng = random.Random(7)
    for _ in range(100):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        pairs.append((f"What is {a} + {b}?", str(a + b)))
    for _ in range(50):
        a, b = rng.randint(20, 99), rng.randint(1, 19)
        pairs.append((f"What is {a} - {b}?", str(a - b)))
    for _ in range(50):
        a, b = rng.randint(2, 9), rng.randint(2, 19)
        pairs.append((f"What is {a} times {b}?", str(a * b)))
    return pairs


def builtin_qa() -> Dataset:
    queries = [
        Query(id=f"qa-{i:04d}", prompt=qa_prompt(q), reference=a) for i, (q, a) in enumerate(qa_pairs())
    ]
    return Dataset(name="qa", queries=queries, scorer="exact", stop=("\n",))


# -- synthetic ------------------------------------------------------------------------------

WORDS = [  # the vocabulary of synthetic prompts
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "can",
    "has",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "energy",
    "model",
    "token",
    "power",
    "batch",
    "server",
    "query",
    "load",
    "clock",
    "counter",
]


def synthetic(
    n: int = 512,
    prompt_tokens: int = 256,
    output_tokens: int = 128,
    sigma: float = 0.5,
    seed: int = 0,
) -> Dataset:
    """Prompts and output lengths drawn lognormal around the given medians, seeded.

    Requests ask for exactly their output length (``max_tokens`` with ``ignore_eos``), so
    the load is controlled whatever the model would have said.
    """
    if n <= 0 or prompt_tokens <= 0 or output_tokens <= 0:
        raise DatasetError("synthetic dataset needs positive --max-queries, prompt and output lengths")
    rng = np.random.default_rng(seed)
    p_lens = np.maximum(1, np.round(rng.lognormal(np.log(prompt_tokens), sigma, n))).astype(int)
    o_lens = np.maximum(1, np.round(rng.lognormal(np.log(output_tokens), sigma, n))).astype(int)
    words = np.array(WORDS)
    # ~4 characters per token: the usual heuristic, and the simulator's tokenizer
    sizes = (p_lens * 4 / 4.5).astype(int) + 1
    # every prompt's words in one draw: the same words as a draw per prompt, at a third of the
    # time (a marginal cost per request that a long run pays before its first one is sent)
    drawn = words[rng.integers(0, words.size, size=int(sizes.sum()))].tolist()
    ends = np.cumsum(sizes).tolist()
    queries = [
        Query(
            id=f"syn-{i:05d}",
            prompt=" ".join(drawn[start:end]),
            max_tokens=int(o_lens[i]),
            extra_body={"ignore_eos": True},
        )
        for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True))
    ]
    return Dataset(name="synthetic", queries=queries)


# -- files ----------------------------------------------------------------------------------

_READERS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "ipc",
    ".feather": "ipc",
    ".ipc": "ipc",
}


def json_rows(path: Path, encoding: str = "utf-8", line: str = "line") -> Iterator[tuple[int, dict[str, Any]]]:
    """Each non-blank line of a JSON-lines file as (its number, its object); DatasetError naming
    the file and the ``line`` of the first that is not a JSON object."""
    with path.open(encoding=encoding) as f:
        for n, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path} {line} {n}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path} {line} {n}: expected a JSON object, got {type(row).__name__}")
            yield n, row


def _locate_bad_json_line(path: Path) -> str:
    try:
        for _ in json_rows(path, line="row"):
            pass
    except DatasetError as exc:
        return str(exc)
    return f"{path}: could not be read as JSON lines"


def _read_frame(path: Path) -> pl.DataFrame:
    import polars as pl  # here: the simulator reads the built-in datasets, and needs no polars

    kind = _READERS.get(path.suffix.lower())
    if kind is None:
        known = ", ".join(sorted(_READERS))
        raise DatasetError(f"{path}: unknown dataset format {path.suffix!r} (use one of {known})")
    try:
        if kind == "jsonl":
            return pl.read_ndjson(path, infer_schema_length=None)
        if kind == "csv":
            return pl.read_csv(path, infer_schema=False)
        if kind == "parquet":
            return pl.read_parquet(path)
        return pl.read_ipc(path)
    except FileNotFoundError:
        raise DatasetError(f"dataset file not found: {path}") from None
    except Exception as exc:
        if kind == "jsonl":
            raise DatasetError(_locate_bad_json_line(path)) from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(f"{path}: could not be read as {kind}: {first}") from exc


def load_file(
    path: str | Path,
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    id_column: str | None = "id",
    scorer: str | None = None,
) -> Dataset:
    """Load queries from JSONL, CSV, Parquet or Arrow; every prompt must be non-empty text."""
    import polars as pl  # here, as in _read_frame

    path = Path(path)
    frame = _read_frame(path)
    if prompt_column not in frame.columns:
        raise DatasetError(
            f"{path}: no column {prompt_column!r} (columns: {', '.join(frame.columns)}); "
            "choose one with --prompt-column"
        )
    if answer_column is not None and answer_column not in frame.columns:
        answer_column = None
    prompts = frame.get_column(prompt_column).to_list()
    answers = frame.get_column(answer_column).to_list() if answer_column else [None] * len(prompts)
    ids = (
        frame.get_column(id_column).cast(pl.String).to_list()
        if id_column and id_column in frame.columns
        else [f"{path.stem}-{i:05d}" for i in range(len(prompts))]
    )
    queries = []
    for row, (qid, prompt, answer) in enumerate(zip(ids, prompts, answers, strict=True), start=1):
        if not isinstance(prompt, str) or not prompt.strip():
            found = "empty" if prompt in (None, "") else f"a {type(prompt).__name__}"
            raise DatasetError(f"{path} row {row}: {prompt_column!r} is {found}, expected text")
        queries.append(Query(id=str(qid), prompt=prompt, reference=None if answer is None else str(answer)))
    if not queries:
        raise DatasetError(f"{path}: no rows")
    return Dataset(name=path.stem, queries=queries, scorer=scorer or ("exact" if answer_column else None))


def resolve(
    spec: str,
    *,
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    synthetic_n: int = 512,
    prompt_tokens: int = 256,
    output_tokens: int = 128,
    length_sigma: float = 0.5,
    seed: int = 0,
) -> Dataset:
    """``qa``, ``synthetic`` or a path to a file."""
    if spec == "qa":
        return builtin_qa()
    if spec == "synthetic":
        return synthetic(synthetic_n, prompt_tokens, output_tokens, length_sigma, seed)
    path = Path(spec)
    if not path.exists():
        raise DatasetError(f"dataset {spec!r} is neither 'qa', 'synthetic' nor an existing file")
    return load_file(path, prompt_column=prompt_column, answer_column=answer_column)
