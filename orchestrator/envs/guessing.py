"""Multi-turn guessing game: the model guesses a secret integer, the environment replies higher/lower.

reset(sample) -> one user message stating the range. Each policy turn's last integer is its guess;
the reply is "higher" (the secret is larger), "lower" or "correct". A correct guess within
`max_turns` guesses ends the episode with reward 1, shaped when `turn_penalty` > 0 to
``max(0, 1 - turn_penalty * (guesses - 1))`` so that fewer guesses score more; running out of guesses
ends it with reward 0. A turn without an integer is answered with a reminder and counts as a guess.

The secret is `sample["secret"]` when given, else drawn from ``random.Random(sample.get("seed", 0))``
in [low, high]: deterministic per sample.

Try it: ``python -c "from orchestrator.envs.guessing import GuessingEnv; e = GuessingEnv(); e.reset({'secret': 7}); print(e.step('5'))"``
"""
from __future__ import annotations

import random
import re

from orchestrator.envs.env import EnvStep

_INT_RE = re.compile(r"-?\d+")


class GuessingEnv:
    """Guess-the-number environment (see the module docstring).

    Args:
        low, high: the inclusive range of the secret (low <= high).
        max_turns: guesses allowed per episode (>= 1).
        turn_penalty: reward shaping per extra guess, in [0, 1]; 0 = reward 1 for any correct guess.
    Sample keys (all optional): "secret" (int in [low, high]), "seed" (int).
    Info per step: {"guess": int | None, "guesses": int}.
    Raises ValueError for bad arguments or a secret outside [low, high].
    """

    def __init__(self, low: int = 1, high: int = 100, max_turns: int = 8, turn_penalty: float = 0.0):
        if low > high or max_turns < 1 or not 0.0 <= turn_penalty <= 1.0:
            raise ValueError(f"guessing env: need low <= high, max_turns >= 1, 0 <= turn_penalty <= 1; "
                             f"got low={low}, high={high}, max_turns={max_turns}, turn_penalty={turn_penalty}")
        self.low, self.high, self.max_turns, self.turn_penalty = low, high, max_turns, turn_penalty
        self.secret, self.guesses = low, 0

    def reset(self, sample: dict) -> str:
        if "secret" in sample:
            self.secret = int(sample["secret"])
            if not self.low <= self.secret <= self.high:
                raise ValueError(f"guessing sample secret={self.secret} is outside [{self.low}, {self.high}]")
        else:
            self.secret = random.Random(int(sample.get("seed", 0))).randint(self.low, self.high)
        self.guesses = 0
        return (f"I am thinking of an integer between {self.low} and {self.high}. Guess it. "
                f"Reply with one integer per turn; I will say higher, lower or correct. "
                f"You have {self.max_turns} guesses.")

    def step(self, action: str) -> EnvStep:
        self.guesses += 1
        found = _INT_RE.findall(action)
        guess = int(found[-1]) if found else None
        info = {"guess": guess, "guesses": self.guesses}
        if guess == self.secret:
            reward = max(0.0, 1.0 - self.turn_penalty * (self.guesses - 1))
            return EnvStep("correct", reward, True, info)
        if self.guesses >= self.max_turns:
            return EnvStep(f"out of guesses; it was {self.secret}", 0.0, True, info)
        if guess is None:
            reply = "Reply with one integer."
        else:
            reply = "higher" if self.secret > guess else "lower"
        return EnvStep(reply, 0.0, False, info)
