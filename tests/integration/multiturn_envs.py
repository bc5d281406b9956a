"""User environments for the multi-turn integration test, loaded by dotted path (env.name).

`ChattyEnv` gives a varying, deterministic reward on a random tiny model (the guessing game would
always score 0 there): each turn's reward is the reply's length modulo 7, over 21. An episode ends
(done) after the second turn when that reply has an even length, else the agent loop's max_turns
truncates it. Every 5th environment built in a process raises at its second step, so the run must
end just those episodes (counted in env/errors) and carry on.
"""
from __future__ import annotations

import itertools

_BUILT = itertools.count(1)


class ChattyEnv:
    def __init__(self, fail_every: int = 5, **ignored):
        self.fail = fail_every > 0 and next(_BUILT) % fail_every == 0
        self.turns = 0

    def reset(self, sample: dict) -> str:
        self.turns = 0
        return f"Tell me something about the number {sample.get('seed', 0)}."

    def step(self, action: str):
        self.turns += 1
        if self.fail and self.turns == 2:
            raise RuntimeError("ChattyEnv: injected failure at the second step")
        reward = (len(action) % 7) / 21.0
        done = self.turns >= 2 and len(action) % 2 == 0
        return "Go on.", reward, done, {"chars": len(action)}


class FaultyGuessingEnv:
    """The guessing game (secret `sample["secret"]`, opening "[game <tag>] ...") for the env-actor test: at its
    second step it hangs for ever (``sample["mode"] == "hang"``), calls ``os._exit`` ("exit") or segfaults
    ("segv"); mode "ok" plays normally. Only meaningful inside an env actor (it would kill a test process)."""

    def __init__(self, **kwargs):
        from orchestrator.rollout.envs.guessing import GuessingEnv

        self.game, self.mode, self.turns = GuessingEnv(**kwargs), "ok", 0

    def reset(self, sample: dict) -> str:
        self.mode, self.turns = sample.get("mode", "ok"), 0
        return f"[game {sample['tag']}] " + self.game.reset(sample)

    def step(self, action: str):
        self.turns += 1
        if self.turns == 2 and self.mode == "hang":
            import time

            time.sleep(3600)
        if self.turns == 2 and self.mode == "exit":
            import os

            os._exit(3)
        if self.turns == 2 and self.mode == "segv":
            import ctypes

            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return self.game.step(action)
