"""The `eval` section of the run config: held-out evaluation on the rollout workers (orchestrator/eval,
docs/eval.md); its check across sections is orchestrator/eval/checks.py `check_eval_config`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.config.fields import number


@dataclass
class EvalConfig:
    """Held-out evaluation on the rollout workers (orchestrator/eval, docs/eval.md): metrics `eval/*` in the row."""
    every_steps: int = number(0, ge=0, finite=True, note="(0 = off)")  # also at step 0 and at the last step
    # The eval prompts: null = none (then `holdout`), "arith" = the built-in task (data.arith_* ranges) drawn with
    # eval.seed, or a .jsonl / .parquet file with prompt and answer; prompts the run trains on are dropped.
    data: Optional[str] = None
    # Or held out of data.source: a fraction (0, 1) or a count (>= 1) of its distinct prompts, never trained on.
    holdout: float = number(0.0, ge=0, finite=True, note="(0 = off)")
    seed: int = 1  # eval.data=arith's generator, the holdout's choice and the eval sampling seeds
    num_prompts: int = number(0, ge=0, finite=True, note="(0 = every eval prompt)")  # the first of the eval set
    n: int = number(1, gt=0)  # samples per prompt (pass@k needs n >= k)
    temperature: float = number(0.0, ge=0, finite=True, note="(0 = greedy)")
    max_new_tokens: int = number(0, ge=0, finite=True, note="(0 = rollout.max_new_tokens)")
    k: list = field(default_factory=lambda: [1])  # pass@k, avg@k and maj@k for each k (1 <= k <= eval.n)
    # A sample is correct when this reward function's value (a name in reward.functions; "reward" = the
    # weighted total; "auto" = accuracy when it is in reward.functions, else the total) is >= pass_threshold.
    pass_function: str = "auto"
    pass_threshold: float = number(1.0, finite=True)
