"""Worked example: your own multi-turn environment, named by dotted path in the config (no file of ours changes).

The policy answers the step's dataset question (the built-in arithmetic task: "What is 7 * 6?"). A wrong
answer gets "Not quite. Try again." and another attempt, up to `max_attempts`. A correct answer ends the
episode with reward 1.0 on the first attempt, minus `attempt_penalty` per extra attempt (never below 0);
running out of attempts ends it with reward 0.0. The answer is the last integer of the turn's text.

Use it: put this file in any importable package (a module in the repository, where the run starts, or a
package installed in the image) and name the class in the run config:

    env:
      name: docs.examples.my_env:RetryArithEnv     # your copy: my_pkg.my_env:RetryArithEnv
      kwargs: {max_attempts: 3, attempt_penalty: 0.25}
      max_turns: 3                                 # policy turns per trajectory (the env ends earlier)
      max_tokens: 512

or, on the demo's config (its `data.source: arith` rows are the questions):

    python -m orchestrator configs/grpo_arith_cpu.yaml env.name=docs.examples.my_env:RetryArithEnv \
        'env.kwargs={max_attempts: 3, attempt_penalty: 0.25}' env.max_turns=3 env.max_tokens=512 rollout.block_size=32

(Not on top of configs/grpo_guessing_cpu.yaml: a command-line mapping merges into the file's `env.kwargs`,
so the guessing game's `low`, `high`, ... would reach this constructor, which refuses them.)

What the orchestrator calls (orchestrator/envs/env.py, orchestrator/rollout/agent_loop.py):
  - the constructor with `env.kwargs` (checked against its signature at start-up), one instance per episode;
  - reset(sample), sample = {"prompt", "answer", "seed"} of the step's dataset row (seed = the group id);
    returns the opening messages: a string (one user message), a message dict or a list of them;
  - step(action_text), the decoded text of the policy's turn; returns (observation, reward, done, info):
    reward a finite float, done a bool, info a dict. The trajectory's reward is the sum of its turn rewards.
An exception, or a call slower than `env.step_timeout_s`, ends only this episode (counted in `env/errors`).

Try it: python -c "from docs.examples.my_env import RetryArithEnv as E; e = E(); print(e.reset({'prompt': 'What is 2 + 3?', 'answer': '5'})); print(e.step('6')); print(e.step('It is 5'))"
"""
from __future__ import annotations

import re

_INT_RE = re.compile(r"-?\d+")


class RetryArithEnv:
    """Answer the row's question; retry after a wrong answer (see the module docstring).

    Args:
        max_attempts: answers allowed per episode (>= 1).
        attempt_penalty: reward taken off per extra attempt, in [0, 1].
    Raises ValueError for bad arguments, or in reset for a row without "prompt" and "answer".
    """

    def __init__(self, max_attempts: int = 3, attempt_penalty: float = 0.25):
        if max_attempts < 1 or not 0.0 <= attempt_penalty <= 1.0:
            raise ValueError(f"RetryArithEnv: need max_attempts >= 1 and 0 <= attempt_penalty <= 1; "
                             f"got max_attempts={max_attempts}, attempt_penalty={attempt_penalty}")
        self.max_attempts, self.attempt_penalty = max_attempts, attempt_penalty
        self.answer, self.attempts = "", 0

    def reset(self, sample: dict) -> str:
        if not sample.get("prompt") or "answer" not in sample:
            raise ValueError(f"RetryArithEnv needs a row with 'prompt' and 'answer', got keys {sorted(sample)}")
        self.answer, self.attempts = str(sample["answer"]).strip(), 0
        return f"{sample['prompt']} Reply with the number only."

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self.attempts += 1
        found = _INT_RE.findall(action)
        guess = found[-1] if found else None
        info = {"attempts": self.attempts, "answer": guess}
        if guess == self.answer:
            return "Correct.", max(0.0, 1.0 - self.attempt_penalty * (self.attempts - 1)), True, info
        if self.attempts >= self.max_attempts:
            return f"Out of attempts; it was {self.answer}.", 0.0, True, info
        return "Not quite. Try again.", 0.0, False, info
