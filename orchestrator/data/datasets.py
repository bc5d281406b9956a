"""Prompt datasets for real users: JSONL or parquet files with `prompt` and `answer` fields.

`load_examples(cfg.data)` returns the examples of the configured source (the built-in arithmetic task
or a file). A bad row fails at load time, naming the file, the row number and the problem, before
any actor starts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchestrator.data.code_tasks import code_arith_examples
from orchestrator.data.rgym import is_reasoning_gym, reasoning_gym_examples
from orchestrator.data.tasks import Example, arithmetic_examples


class DatasetError(ValueError):
    """A dataset file or row is invalid; the message names the file and the row."""


def _check_row(row: object, where: str) -> Example:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object with 'prompt' and 'answer', got {type(row).__name__}")
    for key in ("prompt", "answer"):
        if key not in row or row[key] is None:
            raise DatasetError(f"{where}: missing field {key!r} (fields present: {sorted(row)})")
    if not isinstance(row["prompt"], str) or not row["prompt"].strip():
        raise DatasetError(f"{where}: 'prompt' must be a non-empty string")
    return Example(prompt=row["prompt"], answer=str(row["answer"]))


def read_jsonl(path: Path) -> list[Example]:
    """Read a JSONL file; raises DatasetError naming the line of a malformed or incomplete row."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{i}: not valid JSON ({e.msg})") from None
            out.append(_check_row(row, f"{path}:{i}"))
    return out


def read_parquet(path: Path) -> list[Example]:
    """Read a parquet file (pyarrow); raises DatasetError naming the row of an incomplete row."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return [_check_row(row, f"{path} row {i}") for i, row in enumerate(rows)]


def load_examples(data_cfg) -> list[Example]:
    """The examples of `data.source`: "arith" or "code_arith" (built-in), "reasoning_gym:<task>"
    (orchestrator/data/rgym.py) or a .jsonl / .parquet path.

    Raises DatasetError for a missing file, an unknown extension, an empty dataset, a bad row, an unknown
    reasoning-gym task or a generation parameter it refuses.
    """
    if data_cfg.source == "arith":
        return arithmetic_examples(data_cfg.arith_size, list(data_cfg.arith_ops), data_cfg.arith_min,
                                   data_cfg.arith_max, data_cfg.seed, data_cfg.prompt_suffix)
    if data_cfg.source == "code_arith":  # write f(x); the answer is its unit tests (reward: code_tests)
        return code_arith_examples(data_cfg.arith_size, data_cfg.arith_min, data_cfg.arith_max, data_cfg.seed,
                                   data_cfg.prompt_suffix)
    if is_reasoning_gym(data_cfg.source):
        try:
            return reasoning_gym_examples(data_cfg)
        except ValueError as e:
            raise DatasetError(str(e)) from None
    path = Path(data_cfg.source).expanduser()
    if not path.is_file():
        raise DatasetError(f"data.source={data_cfg.source!r}: no such file (or use 'arith', 'code_arith' or 'reasoning_gym:<task>')")
    readers = {".jsonl": read_jsonl, ".json": read_jsonl, ".parquet": read_parquet}
    if path.suffix not in readers:
        raise DatasetError(f"data.source={data_cfg.source!r}: unknown extension; use one of {sorted(readers)}")
    examples = readers[path.suffix](path)
    if not examples:
        raise DatasetError(f"data.source={data_cfg.source!r} holds no rows")
    if data_cfg.prompt_suffix:
        examples = [Example(e.prompt + " " + data_cfg.prompt_suffix, e.answer) for e in examples]
    return examples


def answer_kind(source: Optional[str]) -> Optional[str]:
    """The gold-answer kind of a built-in source ("answer", "tests", "reference"), None for a file or nothing."""
    if source == "arith":
        return "answer"
    if source == "code_arith":
        return "tests"
    if isinstance(source, str) and source.startswith("reasoning_gym:"):
        return "reference"
    return None
