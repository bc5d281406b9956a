"""Unit tests of orchestrator.data: the arithmetic task, JSONL/parquet datasets, the stateful loader
(including case C08, resume exactly at an epoch boundary) and chat rendering."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.data import (DatasetError, Example, StatefulLoader, arithmetic_examples, load_examples,
                               render_prompt_ids)

MODEL_DIR = Path("~/.cache/rl-orchestrator/models/SmolLM2-135M-Instruct").expanduser()
PROMPT_RE = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def _data_cfg(*overrides: str):
    return load_config(None, list(overrides)).data


# --------------------------------------------------------------------------- arithmetic task


def test_arithmetic_examples_deterministic_in_seed() -> None:
    a = arithmetic_examples(50, ["+", "-", "*"], 0, 9, seed=3)
    b = arithmetic_examples(50, ["+", "-", "*"], 0, 9, seed=3)
    c = arithmetic_examples(50, ["+", "-", "*"], 0, 9, seed=4)
    assert a == b
    assert a != c
    assert len(a) == 50 and all(isinstance(e, Example) for e in a)


def test_arithmetic_answers_are_correct() -> None:
    examples = arithmetic_examples(300, ["+", "-", "*"], 2, 12, seed=0)
    ops_seen = set()
    for e in examples:
        m = PROMPT_RE.fullmatch(e.prompt)
        assert m, e.prompt
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        assert 2 <= a <= 12 and 2 <= b <= 12
        assert e.answer == str(eval(f"{a} {op} {b}"))  # noqa: S307 (digits and one operator)
        ops_seen.add(op)
    assert ops_seen == {"+", "-", "*"}
    # a negative answer is rendered with its sign
    assert any(e.answer.startswith("-") for e in examples)


def test_arithmetic_hand_values() -> None:
    (e,) = arithmetic_examples(1, ["*"], 7, 7, seed=0)
    assert e == Example("What is 7 * 7?", "49")
    (e,) = arithmetic_examples(1, ["-"], 3, 3, seed=0, suffix="Answer with a number.")
    assert e == Example("What is 3 - 3? Answer with a number.", "0")


def test_arithmetic_only_uses_the_given_operators() -> None:
    examples = arithmetic_examples(100, ["*"], 0, 9, seed=1)
    assert all(" * " in e.prompt for e in examples)


@pytest.mark.parametrize("ops", [["/"], ["+", "**"], []])
def test_arithmetic_bad_operator(ops: list[str]) -> None:
    with pytest.raises(ValueError, match=r"allowed operators are \['\+', '-', '\*'\]"):
        arithmetic_examples(10, ops, 0, 9, seed=0)


def test_arithmetic_bad_sizes() -> None:
    with pytest.raises(ValueError, match="arith_size=0"):
        arithmetic_examples(0, ["+"], 0, 9, seed=0)
    with pytest.raises(ValueError, match="arith_min=9, arith_max=1"):
        arithmetic_examples(5, ["+"], 9, 1, seed=0)


def test_load_examples_arith_uses_config() -> None:
    cfg = _data_cfg("data.arith_size=20", "data.arith_ops=[-]", "data.seed=5", "data.prompt_suffix=Be brief.")
    examples = load_examples(cfg)
    assert examples == arithmetic_examples(20, ["-"], 0, 9, 5, "Be brief.")
    assert all(e.prompt.endswith("? Be brief.") for e in examples)


# --------------------------------------------------------------------------- JSONL and parquet


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_parquet(path: Path, columns: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def test_jsonl_reading(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?", "answer": "4"}, "",
                                            {"prompt": "3*3?", "answer": 9, "extra": "ignored"}])
    assert load_examples(_data_cfg(f"data.source={p}")) == [Example("2+2?", "4"), Example("3*3?", "9")]


def test_json_extension_is_read_as_jsonl(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.json", [{"prompt": "a", "answer": "b"}])
    assert load_examples(_data_cfg(f"data.source={p}")) == [Example("a", "b")]


def test_jsonl_bad_json_names_file_and_line(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"},
                                            '{"prompt": "c", "answer": '])
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"{p}:3: not valid JSON" in str(e.value)


def test_jsonl_missing_field_names_file_and_line(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"{p}:2: missing field 'answer'" in str(e.value)
    assert "['prompt']" in str(e.value)  # the fields present


def test_jsonl_null_field_and_non_object(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": None, "answer": "1"}])
    with pytest.raises(DatasetError, match=re.escape(f"{p}:1: missing field 'prompt'")):
        load_examples(_data_cfg(f"data.source={p}"))
    p = _write_jsonl(tmp_path / "e.jsonl", [["a", "1"]])
    with pytest.raises(DatasetError, match=re.escape(f"{p}:1: expected an object") + ".*got list"):
        load_examples(_data_cfg(f"data.source={p}"))


@pytest.mark.parametrize("prompt", ["", "   ", 5])
def test_jsonl_empty_or_non_string_prompt(tmp_path: Path, prompt) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "answer": "1"}, {"prompt": prompt, "answer": "2"}])
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"{p}:2: 'prompt' must be a non-empty string" in str(e.value)


def test_jsonl_without_rows(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", ["", "  "])
    with pytest.raises(DatasetError, match="holds no rows"):
        load_examples(_data_cfg(f"data.source={p}"))


def test_parquet_reading(tmp_path: Path) -> None:
    p = _write_parquet(tmp_path / "d.parquet", {"prompt": ["1+1?", "2*3?"], "answer": [2, 6], "id": [7, 8]})
    assert load_examples(_data_cfg(f"data.source={p}")) == [Example("1+1?", "2"), Example("2*3?", "6")]


def test_parquet_missing_field_names_file(tmp_path: Path) -> None:
    p = _write_parquet(tmp_path / "d.parquet", {"prompt": ["a", "b"]})
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"{p} row 0: missing field 'answer'" in str(e.value)


def test_parquet_bad_row_names_the_row(tmp_path: Path) -> None:
    p = _write_parquet(tmp_path / "d.parquet", {"prompt": ["a", "b", " "], "answer": ["1", "2", "3"]})
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"{p} row 2: 'prompt' must be a non-empty string" in str(e.value)
    p = _write_parquet(tmp_path / "e.parquet", {"prompt": ["a", "b"], "answer": ["1", None]})
    with pytest.raises(DatasetError, match=re.escape(f"{p} row 1: missing field 'answer'")):
        load_examples(_data_cfg(f"data.source={p}"))


def test_unknown_extension(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("prompt,answer\na,1\n")
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"data.source={str(p)!r}: unknown extension" in str(e.value)
    assert "['.json', '.jsonl', '.parquet']" in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError) as e:
        load_examples(_data_cfg(f"data.source={p}"))
    assert f"data.source={str(p)!r}: no such file" in str(e.value)


def test_prompt_suffix_applied_to_file_rows(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?", "answer": "4"}])
    got = load_examples(_data_cfg(f"data.source={p}", "data.prompt_suffix=Answer briefly."))
    assert got == [Example("2+2? Answer briefly.", "4")]
    q = _write_parquet(tmp_path / "d.parquet", {"prompt": ["x"], "answer": ["y"]})
    assert load_examples(_data_cfg(f"data.source={q}", "data.prompt_suffix=S")) == [Example("x S", "y")]


def test_dataset_error_is_a_value_error() -> None:
    assert issubclass(DatasetError, ValueError)


# --------------------------------------------------------------------------- StatefulLoader


def _take(loader: StatefulLoader, k: int) -> list[list]:
    return [loader.next_batch() for _ in range(k)]


def test_loader_batches_cover_each_epoch_exactly_once() -> None:
    items = list(range(24))
    loader = StatefulLoader(items, batch_size=4, seed=1)
    epoch0 = [x for b in _take(loader, 6) for x in b]
    epoch1 = [x for b in _take(loader, 6) for x in b]
    assert sorted(epoch0) == items and sorted(epoch1) == items
    assert epoch0 != epoch1  # a fresh order each epoch
    assert epoch0 != items  # shuffled


def test_loader_batches_spanning_the_epoch_boundary() -> None:
    items = list(range(10))
    loader = StatefulLoader(items, batch_size=4, seed=0)
    batches = _take(loader, 5)  # 20 items = exactly two epochs; batch 3 spans the boundary
    assert all(len(b) == 4 for b in batches)
    stream = [x for b in batches for x in b]
    assert sorted(stream[:10]) == items and sorted(stream[10:]) == items
    assert loader.state_dict() == {"epoch": 1, "position": 10, "seed": 0, "size": 10}


def test_loader_order_depends_on_seed() -> None:
    items = list(range(50))
    a = _take(StatefulLoader(items, 5, seed=0), 10)
    b = _take(StatefulLoader(items, 5, seed=0), 10)
    c = _take(StatefulLoader(items, 5, seed=1), 10)
    assert a == b
    assert a != c
    # the order of epoch e is random.Random(seed * 1_000_003 + e).shuffle
    order = list(range(50))
    random.Random(1 * 1_000_003 + 0).shuffle(order)
    assert [x for batch in c for x in batch] == order


def test_loader_without_shuffle_keeps_file_order() -> None:
    loader = StatefulLoader(list("abcde"), batch_size=2, shuffle=False)
    assert _take(loader, 4) == [["a", "b"], ["c", "d"], ["e", "a"], ["b", "c"]]


@pytest.mark.parametrize("stop", [0, 1, 5, 7, 11, 12, 13, 23, 24, 25, 31])
def test_loader_resume_continues_identically(stop: int) -> None:
    items = [f"p{i}" for i in range(30)]  # 10, 7.5 and 6 batches per epoch for batch sizes 3, 4, 5
    for batch_size in (3, 4, 5):
        reference = StatefulLoader(items, batch_size, seed=7)
        expected = _take(reference, stop + 15)
        interrupted = StatefulLoader(items, batch_size, seed=7)
        assert _take(interrupted, stop) == expected[:stop]
        state = json.loads(json.dumps(interrupted.state_dict()))  # survives a JSON round trip
        resumed = StatefulLoader(items, batch_size, seed=123)  # the seed comes from the state
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        assert _take(resumed, 15) == expected[stop:]


def test_c08_resume_exactly_at_an_epoch_boundary() -> None:
    batch_size, batches_per_epoch = 4, 60
    items = list(range(batch_size * batches_per_epoch))
    uninterrupted = StatefulLoader(items, batch_size, seed=0)
    first_epoch = _take(uninterrupted, 60)
    second_epoch = _take(uninterrupted, 60)

    interrupted = StatefulLoader(items, batch_size, seed=0)
    assert _take(interrupted, 60) == first_epoch
    state = interrupted.state_dict()  # checkpoint at global step 60
    resumed = StatefulLoader(items, batch_size, seed=0)
    resumed.load_state_dict(state)

    nxt = _take(resumed, 60)
    assert nxt == second_epoch  # 60 more batches, the same as without the interruption
    assert sorted(x for b in nxt for x in b) == items  # epoch 2 covered exactly once ...
    order = list(range(len(items)))
    random.Random(0 * 1_000_003 + 1).shuffle(order)
    assert nxt[0] == order[:4]  # ... from its beginning
    assert resumed.state_dict() == {"epoch": 1, "position": 240, "seed": 0, "size": 240}
    assert nxt != first_epoch


def test_loader_size_mismatch_on_resume() -> None:
    loader = StatefulLoader(list(range(10)), 2)
    _take(loader, 3)
    state = loader.state_dict()
    other = StatefulLoader(list(range(11)), 2)
    with pytest.raises(ValueError, match="saved for 10 examples, the dataset has 11"):
        other.load_state_dict(state)


def test_loader_bad_arguments() -> None:
    with pytest.raises(ValueError, match="empty"):
        StatefulLoader([], 2)
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        StatefulLoader([1, 2], 0)


# --------------------------------------------------------------------------- chat rendering


@pytest.fixture(scope="module")
def tokenizer():
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip(f"tokenizer folder {MODEL_DIR} is missing (made by the first run of `make demo`)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_render_prompt_ids_with_the_chat_template(tokenizer) -> None:
    prompt = "What is 3 + 5?"
    ids = render_prompt_ids(tokenizer, prompt)
    assert all(isinstance(i, int) for i in ids)
    text = tokenizer.decode(ids)
    assert text == tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
    assert text.endswith(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt

    ids = render_prompt_ids(tokenizer, prompt, system_prompt="Be brief.")
    assert tokenizer.decode(ids) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                     f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")


def test_render_prompt_ids_too_long_names_the_prompt(tokenizer) -> None:
    prompt = "What is 3 + 5?"
    n = len(render_prompt_ids(tokenizer, prompt))
    assert render_prompt_ids(tokenizer, prompt, max_tokens=n) == render_prompt_ids(tokenizer, prompt)
    with pytest.raises(ValueError) as e:
        render_prompt_ids(tokenizer, prompt, max_tokens=n - 1)
    assert repr(prompt) in str(e.value)
    assert f"{n} tokens > data.max_prompt_tokens={n - 1}" in str(e.value)
