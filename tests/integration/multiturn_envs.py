"""User environments for the multi-turn integration test, loaded by dotted path (env.name).

`ChattyEnv` gives a varying, deterministic reward on a random tiny model (the guessing game would
always score 0 there): each turn's reward is the reply's length modulo 7, over 21. An episode ends
(done) after the second turn when that reply has an even length, else the agent loop's max_turns
truncates it. Every 5th environment built in a process raises at its second step, so the run must
end just those episodes (counted in env/errors) and carry on. With `fail_first_reset`, the first reset of each
group (its sample's seed) in a process raises: with one process playing every episode (one env actor), each group
loses exactly one episode, which has no trajectory (env/reset_failures).
"""
from __future__ import annotations

import itertools
import threading

_BUILT = itertools.count(1)
_RESET_GROUPS: set = set()  # the seeds (group ids) reset so far in this process (fail_first_reset)
_LOCK = threading.Lock()  # env calls run in threads


class ChattyEnv:
    def __init__(self, fail_every: int = 5, fail_first_reset: bool = False, **ignored):
        self.fail = fail_every > 0 and next(_BUILT) % fail_every == 0
        self.fail_first_reset, self.turns = fail_first_reset, 0

    def reset(self, sample: dict) -> str:
        self.turns = 0
        seed = sample.get("seed", 0)
        with _LOCK:
            first = seed not in _RESET_GROUPS
            _RESET_GROUPS.add(seed)
        if self.fail_first_reset and first:
            raise RuntimeError(f"ChattyEnv: injected failure at the first reset of group {seed}")
        return f"Tell me something about the number {seed}."

    def step(self, action: str):
        self.turns += 1
        if self.fail and self.turns == 2:
            raise RuntimeError("ChattyEnv: injected failure at the second step")
        reward = (len(action) % 7) / 21.0
        done = self.turns >= 2 and len(action) % 2 == 0
        return "Go on.", reward, done, {"chars": len(action)}


LOOKUP_TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}


class ToolThenUserEnv:
    """For the Qwen3-template run: a system message with a tool (rendered through the template's tools=), then
    a tool reply after turn 1 and a user reply after turn 2; turn 3 ends it. Rewards as ChattyEnv's. Every action
    text it receives is appended to `record` (JSON lines) so the test can compare them with the trained ids."""

    def __init__(self, record: str = "", **ignored):
        self.record, self.turns = record, 0

    def reset(self, sample: dict) -> list:
        self.turns = 0
        return [{"role": "system", "content": "You are terse.", "tools": [LOOKUP_TOOL]},
                {"role": "user", "content": f"What is {sample.get('seed', 0)}?"}]

    def step(self, action: str):
        import json

        self.turns += 1
        if self.record:
            with open(self.record, "a", encoding="utf-8") as f:
                f.write(json.dumps({"turn": self.turns, "action": action}) + "\n")
        reply = {"role": "tool", "content": f"result {self.turns}"} if self.turns == 1 else "Go on."
        return reply, (len(action) % 7) / 21.0, self.turns >= 3, {}


class FaultyGuessingEnv:
    """The guessing game (secret `sample["secret"]`, opening "[game <tag>] ...") for the env-actor test: at its
    second step it hangs for ever (``sample["mode"] == "hang"``), calls ``os._exit`` ("exit") or segfaults
    ("segv"); mode "ok" plays normally. Only meaningful inside an env actor (it would kill a test process)."""

    def __init__(self, **kwargs):
        from orchestrator.envs.guessing import GuessingEnv

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
