"""Built-in procedural task with verifiable answers: one-digit arithmetic ("What is 3 + 5?").

SmolLM2-135M-Instruct sampled at T=1 answers about a quarter of these right (greedy: about 70%), so
most groups of 8 have mixed rewards: a learning signal GRPO can use on two CPU cores.
"""
from __future__ import annotations

import operator
import random
from dataclasses import dataclass

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass(frozen=True)
class Example:
    """One prompt with its gold answer (a string)."""

    prompt: str
    answer: str


def arithmetic_examples(size: int, ops: list[str], lo: int, hi: int, seed: int, suffix: str = "") -> list[Example]:
    """`size` examples "What is a <op> b?" with a, b uniform in [lo, hi], deterministic in `seed`.

    Raises ValueError for an unknown operator (allowed: +, -, *), size < 1 or lo > hi.
    """
    bad = [op for op in ops if op not in _OPS]
    if bad or not ops:
        raise ValueError(f"data.arith_ops={list(ops)}: allowed operators are {list(_OPS)}")
    if size < 1 or lo > hi:
        raise ValueError(f"data.arith_size={size}, arith_min={lo}, arith_max={hi}: need size >= 1 and min <= max")
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(list(ops))
        text = f"What is {a} {op} {b}?" + (f" {suffix}" if suffix else "")
        out.append(Example(prompt=text, answer=str(_OPS[op](a, b))))
    return out
