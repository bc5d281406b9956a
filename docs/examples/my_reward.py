"""Worked example: your own reward function, named by dotted path in the config (no file of ours changes).

`number_at_end` gives 1.0 to a completion whose text ends with the gold answer as its last number (a
trailing period or spaces allowed: "... so 7 * 6 = 42."), else 0.0. The demo's prompt asks for exactly
that ("Give the final answer as a number at the end."); the built-in `accuracy` takes the last number
anywhere, so this one also rewards the format. Add it next to `accuracy` with a small weight:

    reward:
      functions:
        - {name: accuracy, weight: 1.0}
        - {name: "docs.examples.my_reward:number_at_end", weight: 0.2}   # your copy: my_pkg.my_reward:number_at_end

    python -m orchestrator configs/grpo_arith_cpu.yaml \
        'reward.functions=[{name: accuracy, weight: 1.0}, {name: "docs.examples.my_reward:number_at_end", weight: 0.2}]'

The contract (orchestrator/reward/functions.py, orchestrator/reward/scorer.py): called with the
completions of ONE group and their gold answers (strings), it returns one finite float per completion.
It runs in a reward worker process under `reward.timeout_s` and `reward.memory_limit_mb` (a timeout scores
0.0 for that group, counted in `reward/timeouts`; an exception scores 0.0, counted in `reward/errors`; memory
past the limit scores 0.0, counted in `reward/memory_errors`; the run stops when more than
`reward.max_failed_frac` of a step's calls fail); a wrong number of values, or a
value that is not a finite number, raises an error naming the function (case C05). Each function is
logged as `reward/<name>_mean` (the name as the config gives it); `reward/mean` is the weighted sum.

Try it: python -c "from docs.examples.my_reward import number_at_end; print(number_at_end(['7 * 6 = 42.', '42 is it'], ['42', '42']))"
"""
from __future__ import annotations

import re

_LAST_NUMBER_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*\.?\s*$")


def number_at_end(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 per completion that ends with its gold answer as a number, else 0.0.

    Args:
        completions: the completions of one group, length G.
        answers: their gold answers, length G ("42"; compared as numbers, so "42.0" matches "42").
    Returns:
        list[float] of length G, each 0.0 or 1.0.
    Raises:
        ValueError: when `completions` and `answers` differ in length.
    """
    if len(completions) != len(answers):
        raise ValueError(f"number_at_end: got {len(completions)} completions and {len(answers)} answers")
    scores = []
    for text, gold in zip(completions, answers):
        match = _LAST_NUMBER_RE.search(text)
        try:
            ok = match is not None and float(match.group(1)) == float(str(gold).strip())
        except ValueError:  # a gold answer that is not a number never matches
            ok = False
        scores.append(1.0 if ok else 0.0)
    return scores
