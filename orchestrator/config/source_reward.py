"""Which reward functions can score which data sources: checked at load, before any actor starts.

The built-in sources write different gold answers: ``arith`` a number, ``code_arith`` unit tests (assert lines),
``reasoning_gym:<task>`` a reference to the task's entry. A reward that reads another kind of gold answer scores
every sample 0 (``accuracy`` against assert lines), passes every sample (unit tests that are not asserts), or fails
every call (``reasoning_gym`` against a number), so the pairs below are refused naming the keys. A file source
(``.jsonl`` / ``.parquet``) can hold any kind and is not checked; neither are user reward functions.
"""
from __future__ import annotations

from typing import Optional

from orchestrator.data.datasets import answer_kind

# gold-answer kind of each built-in source -> the built-in rewards that read it
_READS = {"answer": {"accuracy", "boxed_format"}, "tests": {"code_tests", "boxed_format"},
          "reference": {"reasoning_gym", "boxed_format"}}
_BUILT_IN = {"accuracy", "boxed_format", "code_tests", "reasoning_gym"}
_FOR = {"answer": "numbers", "tests": "unit tests (assert lines)", "reference": "references to the task's entries"}
_USE = {"answer": "accuracy", "tests": "code_tests", "reference": "reasoning_gym"}


def _check(kind: Optional[str], names: list[str], source_key: str, source: str, reward_key: str) -> None:
    if kind is None:
        return
    wrong = [n for n in names if n in _BUILT_IN and n not in _READS[kind]]
    if wrong:
        raise ValueError(f"{reward_key}={names}: {wrong} cannot score {source_key}={source!r}, whose gold answers are "
                         f"{_FOR[kind]}; use {_USE[kind]!r}")


def check_source_rewards(cfg) -> None:
    """Raise ValueError naming the keys when a built-in reward cannot score a built-in source's gold answers:
    the run's reward functions against data.source (single-turn) and eval.data, and a multi-turn python tool's
    env.kwargs.reward_fn (default code_tests) against data.source."""
    names = [f.name for f in cfg.reward.functions]
    if not cfg.env.name:
        _check(answer_kind(cfg.data.source), names, "data.source", cfg.data.source, "reward.functions")
    if cfg.eval.data:
        _check(answer_kind(cfg.eval.data), names, "eval.data", cfg.eval.data, "reward.functions")
    if cfg.env.name == "python":
        reward_fn = dict(cfg.env.kwargs or {}).get("reward_fn", "code_tests")
        _check(answer_kind(cfg.data.source), [reward_fn], "data.source", cfg.data.source, "env.kwargs.reward_fn")
