"""The agent loop with the real SmolLM2 chat template, the guessing game and a fake async engine
whose "policy" binary-searches: trajectories overlap (no lockstep), stay on their group's worker,
and a failing or hanging environment ends only its own episode."""
import asyncio
import re
import threading
import time

import pytest
from transformers import AutoTokenizer

from orchestrator.utils.models import resolve_model_path
from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.rollout.chat_render import ChatRenderer
from orchestrator.envs.env import resolve_env_factory
from orchestrator.envs.env_runner import EnvRunner
from orchestrator.envs.guessing import GuessingEnv
from orchestrator.rollout.router import StickyRouter

HANG = threading.Event()


class TaggedGuessingEnv(GuessingEnv):
    """GuessingEnv whose opening names the game, so the fake engine can tell groups apart."""

    def reset(self, sample):
        self.mode = sample.get("mode", "ok")
        if self.mode == "reset_fails":
            raise ValueError("no such game")
        return f"[game {sample['tag']}] " + super().reset(sample)

    def step(self, action):
        if self.mode == "boom":
            raise RuntimeError("env crashed")
        if self.mode == "hang":
            HANG.wait(10)
        return super().step(action)


class BinarySearchEngine:
    """Fake async engine: reads the conversation, answers the binary-search guess, sleeps per game.

    Records every call as (tag, turn, worker) and start/end events, and the most calls in flight.
    With `gate` > 0, first turns wait (up to 2 s) until `gate` first turns are in flight together.
    """

    def __init__(self, tok, delay_s, gate=0):
        self.tok, self.delay_s, self.gate = tok, delay_s, gate
        self.calls, self.events, self.in_flight, self.max_in_flight = [], [], 0, 0
        self.first_turns, self.gate_open = 0, None

    async def generate(self, prompt_ids, max_tokens, worker):
        text = self.tok.decode(prompt_ids)
        tag = int(re.search(r"\[game (\d+)\]", text).group(1))
        guesses = [int(g) for g in re.findall(r"<\|im_start\|>assistant\n(\d+)<\|im_end\|>", text)]
        replies = re.findall(r"<\|im_start\|>user\n(higher|lower)<\|im_end\|>", text)
        lo, hi = 1, 100
        for g, r in zip(guesses, replies):
            lo, hi = (g + 1, hi) if r == "higher" else (lo, g - 1)
        turn = len(guesses) + 1
        self.calls.append((tag, turn, worker))
        self.events.append(("start", tag, turn))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.gate and turn == 1:
            self.gate_open = self.gate_open or asyncio.Event()
            self.first_turns += 1
            if self.first_turns == self.gate:
                self.gate_open.set()
            await asyncio.wait_for(self.gate_open.wait(), 2.0)
        await asyncio.sleep(self.delay_s(tag, turn))
        self.in_flight -= 1
        self.events.append(("end", tag, turn))
        ids = self.tok(str((lo + hi) // 2), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return ids, [-0.25] * len(ids), "stop"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model_path("default"))


def make_loop(tok, engine, workers=2, timeout_s=5.0, **cfg):
    runner = EnvRunner(TaggedGuessingEnv, {"max_turns": 8}, num_workers=8, step_timeout_s=timeout_s)
    return AgentLoop(engine, runner, ChatRenderer(tok, "strict"), StickyRouter(workers),
                     AgentLoopConfig(**{"max_turns": 8, "max_tokens": 1024, "max_new_tokens": 8, **cfg}))


def test_guessing_rollouts_overlap_and_stay_on_their_worker(tok):
    # binary search over [1, 100] by hand: 50 -> 1 guess; 25 -> 50, 25; 37 -> 50, 25, 37;
    # 100 -> 50, 75, 88, 94, 97, 99, 100
    secrets, expected_turns = [50, 25, 37, 100], [1, 2, 3, 7]
    engine = BinarySearchEngine(tok, delay_s=lambda tag, turn: 0.5 if (tag, turn) == (3, 1) else 0.0, gate=12)
    groups = [GroupRequest(g, {"tag": g, "secret": s}, n=3) for g, s in enumerate(secrets)]
    trajectories, m = make_loop(tok, engine).run_sync(groups)
    assert "env/actor_restarts" not in m  # thread placement: the metrics are as before env actors

    assert [(t.group_id, t.sample_index) for t in trajectories] == [(g, i) for g in range(4) for i in range(3)]
    for t in trajectories:
        assert t.stop_reason == "done" and t.reward == 1.0 and t.num_turns == expected_turns[t.group_id]
        assert t.trained_logprobs() == [-0.25] * sum(t.loss_mask)
    t37 = trajectories[2 * 3]
    assert tok.decode(t37.trained_ids()) == "50<|im_end|>25<|im_end|>37<|im_end|>"
    assert tok.decode(t37.response_ids).endswith("<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n37<|im_end|>")
    # sticky: every turn of every sample of a group went to one worker; groups are spread (cap 3)
    workers = {tag: {w for t_, _, w in engine.calls if t_ == tag} for tag in range(4)}
    assert all(len(ws) == 1 for ws in workers.values())
    assert len(engine.calls) == 3 * sum(expected_turns)
    assert m["router/groups_per_worker_max"] <= 3
    # concurrent: all 12 first turns were in flight together (a one-at-a-time loop would time out at
    # the gate); continuous, not lockstep: game 2 started its third turn while game 3's first turn
    # (0.5 s) was still running
    assert engine.max_in_flight == 12
    ev = engine.events
    assert ev.index(("start", 2, 3)) < ev.index(("end", 3, 1))
    assert m["rollout/turns_mean"] == pytest.approx(sum(expected_turns) / 4)
    assert m["rollout/truncated_frac"] == 0.0 and m["env/errors"] == 0.0 and m["rollout/reward_mean"] == 1.0


def test_max_turns_truncates(tok):
    engine = BinarySearchEngine(tok, delay_s=lambda tag, turn: 0.0)
    groups = [GroupRequest(0, {"tag": 0, "secret": 100}, n=2), GroupRequest(1, {"tag": 1, "secret": 50}, n=2)]
    trajectories, m = make_loop(tok, engine, max_turns=3).run_sync(groups)
    assert [t.stop_reason for t in trajectories] == ["max_turns", "max_turns", "done", "done"]
    assert trajectories[0].num_turns == 3 and trajectories[0].reward == 0.0
    assert tok.decode(trajectories[0].response_ids).endswith("assistant\n88<|im_end|>")  # no trailing observation
    assert m["rollout/truncated_frac"] == 0.5


def test_failing_and_hanging_envs_end_only_their_episodes(tok):
    HANG.clear()
    engine = BinarySearchEngine(tok, delay_s=lambda tag, turn: 0.0)
    groups = [GroupRequest(0, {"tag": 0, "secret": 37}, n=2),
              GroupRequest(1, {"tag": 1, "secret": 37, "mode": "boom"}, n=2),
              GroupRequest(2, {"tag": 2, "secret": 37, "mode": "hang"}, n=2),
              GroupRequest(3, {"tag": 3, "secret": 37, "mode": "reset_fails"}, n=2)]
    loop = make_loop(tok, engine, timeout_s=0.3)
    t0 = time.perf_counter()
    trajectories, m = loop.run_sync(groups)
    elapsed = time.perf_counter() - t0
    HANG.set()
    assert elapsed < 5.0  # the hung steps were abandoned after 0.3 s, not waited for (10 s)
    by_group = {g: [t for t in trajectories if t.group_id == g] for g in range(4)}
    assert [t.stop_reason for t in by_group[0]] == ["done", "done"] and by_group[0][0].num_turns == 3
    assert all(t.stop_reason == "env_error" and "RuntimeError: env crashed" in t.env_error for t in by_group[1])
    assert all(t.stop_reason == "env_error" and "timeout" in t.env_error for t in by_group[2])
    assert all(t.num_turns == 1 and t.turn_rewards == [] and not t.truncated for t in by_group[1] + by_group[2])
    assert by_group[3] == []  # reset failed: no prompt, no trajectory
    assert m["env/errors"] == 6.0 and m["env/timeouts"] == 2.0 and m["env/reset_failures"] == 2.0
    assert m["rollout/trajectories"] == 6.0


class CalculatorPolicyEngine:
    """Turn 1: a calculator tool call; turn 2: the answer, read from the tool reply in the prompt."""

    def __init__(self, tok):
        self.tok = tok

    async def generate(self, prompt_ids, max_tokens, worker):
        text = self.tok.decode(prompt_ids)
        result = re.findall(r"<\|im_start\|>tool\n([^<]*)<\|im_end\|>", text)
        reply = (f"The answer is {result[-1]}." if result else
                 '<tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>')
        ids = self.tok(reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return ids, [-0.5] * len(ids), "stop"


def test_calculator_tool_use_through_the_chat_template(tok):
    loop = AgentLoop(CalculatorPolicyEngine(tok), EnvRunner(resolve_env_factory("calculator")),
                     ChatRenderer(tok, "strict"), StickyRouter(1), AgentLoopConfig(max_turns=4, max_new_tokens=64))
    (t,), m = loop.run_sync([GroupRequest(0, {"prompt": "What is 3 * (4 + 5)?", "answer": "27"}, n=1)])
    assert t.stop_reason == "done" and t.num_turns == 2 and t.turn_rewards == [0.0, 1.0]
    observation = [tid for tid, mask in zip(t.response_ids, t.loss_mask) if not mask]
    assert tok.decode(observation) == "\n<|im_start|>tool\n27<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(t.trained_ids()).endswith("</tool_call><|im_end|>The answer is 27.<|im_end|>")
    assert m["env/step_s_mean"] > 0.0


class SeedRecordingEngine(BinarySearchEngine):
    """Records the `seed` keyword of every turn (absent when the group has none) by (tag, turn)."""

    def __init__(self, tok):
        super().__init__(tok, delay_s=lambda tag, turn: 0.0)
        self.seeds = []

    async def generate(self, prompt_ids, max_tokens, worker, **kw):
        out = await super().generate(prompt_ids, max_tokens, worker)
        self.seeds.append(kw.get("seed", "absent"))
        return out


def test_every_turn_of_every_sample_gets_its_own_seed(tok):
    from orchestrator.rollout.seeds import sample_seed, turn_seed

    engine = SeedRecordingEngine(tok)
    groups = [GroupRequest(0, {"tag": 0, "secret": 37}, n=2, seed=11), GroupRequest(1, {"tag": 1, "secret": 50}, n=1)]
    make_loop(tok, engine).run_sync(groups)
    expected = {turn_seed(sample_seed(11, i), t) for i in range(2) for t in range(3)}  # 37: 3 turns per sample
    assert sorted(s for s in engine.seeds if s != "absent") == sorted(expected) and len(expected) == 6
    assert engine.seeds.count("absent") == 1  # the unseeded group's one turn: the engine's random state
