"""The `data` section of the run config (orchestrator/config/schema.py imports it), with `data.reasoning_gym`: the
generation parameters of a reasoning-gym task (`data.source=reasoning_gym:<task>`, orchestrator/data/rgym.py,
docs/data-sources.md). Its own module so that schema.py stays small.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.config.fields import choice, number

# How the reward `reasoning_gym` takes the answer out of a completion (orchestrator/reward/rgym.py):
# answer_tag = the last <answer>...</answer> (reasoning_gym.utils.extract_answer, the library's convention),
# last_line = the last non-empty line, final_answer = the last \boxed{} or else the last number (as `accuracy`).
ANSWER_FORMATS = ("answer_tag", "last_line", "final_answer")


@dataclass
class ReasoningGymConfig:
    size: int = number(1000, gt=0)  # rows generated (the dataset's `size`): distinct examples per epoch
    seed: Optional[int] = None  # the generator's seed (the dataset's `seed`); None = data.seed
    # The task's own generation parameters, passed to reasoning_gym.create_dataset(<task>, **config, size, seed),
    # e.g. {min_terms: 2, max_terms: 2, max_digits: 1} for basic_arithmetic; an unknown or invalid one is an error.
    config: dict = field(default_factory=dict)
    answer_format: str = choice("answer_tag", ANSWER_FORMATS)


@dataclass
class DataConfig:
    # "arith" = built-in procedural arithmetic task; or a path to a .jsonl / .parquet file with
    # `prompt` and `answer` fields; or "reasoning_gym:<task>" (data.reasoning_gym, docs/data-sources.md).
    source: str = "arith"
    # Built-in task: operations drawn from this list ("+", "-", "*") and operands in [min, max].
    arith_ops: list = field(default_factory=lambda: ["+", "*"])
    arith_min: int = 0
    arith_max: int = 9
    # Number of distinct examples the built-in task generates per epoch.
    arith_size: int = 1000
    # Text appended to every prompt (an instruction about the answer format); may be "".
    prompt_suffix: str = ""
    # System prompt for the chat template; None = the template's default.
    system_prompt: Optional[str] = None
    shuffle: bool = True
    seed: int = 0
    # Prompts longer than this (tokens, after the chat template) are an error naming the row.
    max_prompt_tokens: int = number(256, ge=0, finite=True)
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)  # data.source=reasoning_gym:<task>
