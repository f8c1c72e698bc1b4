"""Datasets and scorers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ipw_async.scoring import score
from ipw_async.workload.datasets import DatasetError, builtin_qa, load_file, question_of, synthetic


def test_builtin_qa_has_hundreds_of_answered_questions() -> None:
    ds = builtin_qa()
    assert len(ds) >= 300
    assert all(q.reference for q in ds.queries)
    assert len({q.id for q in ds.queries}) == len(ds)
    assert question_of(ds.queries[0].prompt) == "What is the capital of Japan?"
    assert ds.stop == ("\n",)


def test_synthetic_lengths_are_seeded_lognormal() -> None:
    a, b = synthetic(400, 200, 100, 0.5, seed=3), synthetic(400, 200, 100, 0.5, seed=3)
    assert [q.max_tokens for q in a.queries] == [q.max_tokens for q in b.queries]
    outs = np.array([q.max_tokens for q in a.queries])
    assert np.median(outs) == pytest.approx(100, rel=0.15)
    assert all(q.extra_body == {"ignore_eos": True} for q in a.queries)
    fixed = synthetic(10, 50, 20, 0.0)
    assert {q.max_tokens for q in fixed.queries} == {20}


def test_synthetic_prompts_are_the_words_a_per_prompt_draw_gives() -> None:
    """A seed names the same prompts in every version: the words are drawn for all prompts at
    once, and they are the ones drawing each prompt's words in turn gave."""
    from ipw_async.workload.datasets import WORDS

    rng = np.random.default_rng(11)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(300), 0.8, 50))).astype(int)
    rng.lognormal(np.log(60), 0.8, 50)  # the output lengths, drawn next
    words = np.array(WORDS)
    each = [" ".join(rng.choice(words, size=int(n * 4 / 4.5) + 1)) for n in lengths]
    assert [q.prompt for q in synthetic(50, 300, 60, 0.8, seed=11).queries] == each


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", ".arrow"])
def test_files_load_through_polars(tmp_path: Path, suffix: str) -> None:
    frame = pl.DataFrame({"question": ["2+2?", "capital of France?"], "gold": ["4", "Paris"]})
    path = tmp_path / f"data{suffix}"
    {
        ".jsonl": frame.write_ndjson,
        ".csv": frame.write_csv,
        ".parquet": frame.write_parquet,
        ".arrow": frame.write_ipc,
    }[suffix](path)
    ds = load_file(path, prompt_column="question", answer_column="gold")
    assert [q.prompt for q in ds.queries] == ["2+2?", "capital of France?"]
    assert [q.reference for q in ds.queries] == ["4", "Paris"]


def test_missing_prompt_column_names_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,answer\nhello,world\n")
    with pytest.raises(DatasetError, match=r"no column 'prompt' \(columns: text, answer\).*--prompt-column"):
        load_file(path)


def test_empty_prompt_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": ""}\n')
    with pytest.raises(DatasetError, match=r"d.jsonl row 2: 'prompt' is empty"):
        load_file(path)


def test_non_object_json_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"row 2: expected a JSON object"):
        load_file(path)


@pytest.mark.parametrize(
    ("answer", "reference", "scorer", "expected"),
    [
        (" Tokyo", "Tokyo", "exact", True),
        ("Let me think. The answer is Paris.", "Paris", "exact", True),
        ("The answer is Lyon.", "Paris", "exact", False),
        ("It is 1,024 exactly", "1024", "numeric", True),
        ("answer: 41", "42", "numeric", False),
        ("The answer is (B)", "B", "choice", True),
        ("the capital is the city of Rome, of course", "Rome", "contains", True),
        ("anything", None, "exact", None),
    ],
)
def test_scorers(answer: str, reference: str | None, scorer: str, expected: bool | None) -> None:
    assert score(answer, reference, scorer) is expected
