"""Built-in procedural coding task (``data.source: code_arith``): write ``f(x)``, scored by unit tests.

"Write a Python function f(x) that returns 3 * x + 2." The gold answer is four unit tests, one per line
(``assert f(-1) == -1``), which the `code_tests` reward runs in the sandbox (orchestrator/reward/code_tests.py);
the reward is the fraction passed. Deterministic in the seed: the same (size, seed, lo, hi) give the same rows.
Coefficients are drawn from [lo, hi] (``data.arith_min`` / ``data.arith_max``, at least 1 apart from 0 for
divisors); the test inputs from [-5, 10].
"""
from __future__ import annotations

import random

from orchestrator.data.tasks import Example

# (description, reference) templates over x and the coefficients a, b, d (d >= 2); each gives an int for int x.
_TEMPLATES = (
    ("x plus {a}", lambda x, a, b, d: x + a),
    ("x times {a}", lambda x, a, b, d: x * a),
    ("{a} * x + {b}", lambda x, a, b, d: a * x + b),
    ("x squared plus {b}", lambda x, a, b, d: x * x + b),
    ("the larger of x and {a}", lambda x, a, b, d: max(x, a)),
    ("x modulo {d} (Python's % operator)", lambda x, a, b, d: x % d),
    ("the absolute value of (x - {a})", lambda x, a, b, d: abs(x - a)),
    ("{a} if x is even, else x", lambda x, a, b, d: a if x % 2 == 0 else x),
)
_NUM_TESTS = 4
_INPUTS = range(-5, 11)
_INSTRUCTION = "Give only the function in one ```python code block."


def code_arith_examples(size: int, lo: int, hi: int, seed: int, suffix: str = "") -> list[Example]:
    """`size` rows: a prompt asking for ``f(x)`` and, as the answer, its unit tests (one assert per line).

    Args:
        size: rows to generate (>= 1).
        lo, hi: range of the coefficients (lo <= hi).
        seed: the generator's seed.
        suffix: text after the prompt; "" = the built-in instruction to answer with one python block.
    Raises:
        ValueError: size < 1 or lo > hi.
    """
    if size < 1 or lo > hi:
        raise ValueError(f"data.arith_size={size}, arith_min={lo}, arith_max={hi}: need size >= 1 and min <= max")
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        template, reference = rng.choice(_TEMPLATES)
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        d = max(2, abs(rng.randint(lo, hi)))
        inputs = rng.sample(list(_INPUTS), _NUM_TESTS)
        tests = "\n".join(f"assert f({x}) == {reference(x, a, b, d)}" for x in inputs)
        prompt = f"Write a Python function f(x) that returns {template.format(a=a, b=b, d=d)}. {suffix or _INSTRUCTION}"
        out.append(Example(prompt=prompt, answer=tests))
    return out
