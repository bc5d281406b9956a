"""Built-in verifiable reward functions and the resolver for user reward functions.

Every reward function, built-in or user-supplied, has one signature::

    fn(completions: list[str], answers: list[str]) -> list[float]

It is called with the completions of ONE group (all samples of one prompt) and their gold answers,
and returns one value per completion. `RewardScorer` (orchestrator/reward/scorer.py) calls it in a
worker process under a hard timeout and checks the length and finiteness of what it returns.

User functions are named by a dotted path, ``"pkg.module:function"`` or ``"pkg.module.function"``;
`resolve_reward_fn` turns a built-in name or such a path into the callable.

Try it: ``python -c "from orchestrator.reward.functions import accuracy; print(accuracy(['3 + 5 = 8.'], ['8']))"``
"""

from __future__ import annotations

import logging
import re
from typing import Callable

from math_verify import parse, verify

from orchestrator.reward.code_tests import code_tests
from orchestrator.utils.user_code import import_user_module, split_dotted

# math-verify warns once per process that its own (signal-based) timeouts are off: we turned them
# off on purpose, because the scorer enforces a hard timeout in worker processes instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)

RewardFn = Callable[[list[str], list[str]], list[float]]

_BOXED_PREFIXES = ("\\boxed", "\\fbox")
# A number: optional sign (not a hyphen glued to a word), digits with optional thousands commas,
# optional decimals, optionally a fraction "a/b".
_NUMBER_RE = re.compile(
    r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
)


def _boxed_contents(text: str) -> list[str]:
    """Return the contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in `text`, in order.

    Braces are matched with a counter, so nested groups (``\\boxed{\\frac{3}{4}}``) are kept whole.
    An unclosed box is ignored.
    """
    found: list[tuple[int, str]] = []
    for prefix in _BOXED_PREFIXES:
        start = text.find(prefix)
        while start != -1:
            i = start + len(prefix)
            while i < len(text) and text[i] == " ":
                i += 1
            if i < len(text) and text[i] == "{":
                depth, j = 0, i
                while j < len(text):
                    depth += {"{": 1, "}": -1}.get(text[j], 0)
                    if depth == 0:
                        found.append((start, text[i + 1 : j]))
                        break
                    j += 1
            start = text.find(prefix, start + len(prefix))
    found.sort()
    return [body for _, body in found]


def extract_final_answer(text: str) -> str | None:
    """Return the final answer of a completion, or None when it has none.

    The answer is the content of the last non-empty ``\\boxed{...}`` if any, else the last number in
    the text (integers, decimals, negatives, fractions like ``3/4``, thousands commas like ``1,234``;
    commas are removed). ``"3 + 5 = 8."`` gives ``"8"``.
    """
    boxed = [body.strip() for body in _boxed_contents(text) if body.strip()]
    if boxed:
        return boxed[-1]
    numbers = _NUMBER_RE.findall(text)
    if not numbers:
        return None
    return re.sub(r"\s+", "", numbers[-1]).replace(",", "")


def _normalise(answer: str) -> str:
    """Normalise an answer string for exact comparison: no spaces, ``$``, trailing dot or case."""
    answer = re.sub(r"\s+", "", answer).strip("$").rstrip(".").lower()
    return re.sub(r"(?<=\d),(?=\d{3})", "", answer)


def answers_match(predicted: str, gold: str) -> bool:
    """True when `predicted` and `gold` denote the same mathematical answer.

    Compared by math-verify (symbolic and numeric equality; its signal-based timeouts are disabled,
    because this runs off the main thread under `RewardScorer`'s process timeout). When math-verify
    parses nothing from either side, falls back to exact normalised string equality.
    """
    gold_parsed = parse(_as_boxed(gold), parsing_timeout=None)  # type: ignore[arg-type]
    pred_parsed = parse(_as_boxed(predicted), parsing_timeout=None)  # type: ignore[arg-type]
    if gold_parsed and pred_parsed:
        if verify(gold_parsed, pred_parsed, timeout_seconds=None):
            return True
    return _normalise(predicted) == _normalise(gold)


def _as_boxed(answer: str) -> str:
    """Wrap a bare answer in ``\\boxed{}`` so math-verify parses it as LaTeX (``\\frac``, ``1,234``)."""
    return answer if "\\boxed" in answer else "\\boxed{" + answer + "}"


def _gold_answer(gold: str) -> str:
    """The gold answer itself: the last boxed content when the gold text has one, else the text."""
    boxed = [body.strip() for body in _boxed_contents(gold) if body.strip()]
    return boxed[-1] if boxed else gold.strip()


def accuracy(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 per completion whose final answer equals its gold answer, else 0.0.

    The final answer is `extract_final_answer` (last ``\\boxed{}``, else last number); equality is
    `answers_match` (math-verify, with a normalised-string fallback). A completion or gold answer with
    no answer at all scores 0.0.

    Args:
        completions: the completions of one group, length G.
        answers: their gold answers, length G.
    Returns:
        list[float] of length G, each 0.0 or 1.0.
    Raises:
        ValueError: when `completions` and `answers` differ in length.
    """
    if len(completions) != len(answers):
        raise ValueError(
            f"accuracy: got {len(completions)} completions and {len(answers)} answers"
        )
    scores: list[float] = []
    for completion, answer in zip(completions, answers):
        predicted = extract_final_answer(completion)
        gold = _gold_answer(str(answer))
        ok = predicted is not None and bool(gold) and answers_match(predicted, gold)
        scores.append(1.0 if ok else 0.0)
    return scores


def boxed_format(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 per completion that contains a non-empty ``\\boxed{...}`` answer, else 0.0.

    Args:
        completions: the completions of one group, length G.
        answers: their gold answers (unused; kept for the common signature).
    Returns:
        list[float] of length G.
    """
    del answers
    return [1.0 if any(b.strip() for b in _boxed_contents(c)) else 0.0 for c in completions]


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "accuracy": accuracy,
    "boxed_format": boxed_format,
    "code_tests": code_tests,  # unit tests passed, run in the sandbox (orchestrator/reward/code_tests.py)
}


def resolve_reward_fn(name: str) -> RewardFn:
    """Return the reward function called `name`.

    Args:
        name: a built-in name (a key of `BUILTIN_REWARDS`) or a dotted path to an importable callable,
            ``"pkg.module:function"`` or ``"pkg.module.function"`` (``"pkg.module:Class.method"`` works).
    Returns:
        The callable.
    Raises:
        ValueError: naming `name` and listing the built-ins, when the module cannot be imported, the
            attribute does not exist, or the object is not callable.
    """
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    builtins = ", ".join(sorted(BUILTIN_REWARDS))
    hint = f"use a built-in ({builtins}) or a dotted path 'pkg.module:function'"
    parts = split_dotted(name)
    if parts is None:
        raise ValueError(f"unknown reward function {name!r}: {hint}")
    module_name, attr_path = parts
    obj: object = import_user_module(module_name, f"reward function {name!r}", hint)
    try:
        for attr in attr_path.split("."):
            obj = getattr(obj, attr)
    except AttributeError as error:
        raise ValueError(f"cannot resolve reward function {name!r} ({error}): {hint}") from error
    if not callable(obj):
        raise ValueError(
            f"reward function {name!r} resolves to a {type(obj).__name__}, not a callable: {hint}"
        )
    return obj  # type: ignore[return-value]
