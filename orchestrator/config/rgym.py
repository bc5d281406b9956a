"""The `data.reasoning_gym` section: generation parameters of a reasoning-gym task (`data.source=reasoning_gym:<task>`).

Its own module so that schema.py stays small; orchestrator/data/rgym.py reads it. Docs: docs/data-sources.md.
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
