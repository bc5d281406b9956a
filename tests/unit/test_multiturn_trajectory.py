"""Multi-turn trajectories: token-in, token-out (case C07), loss-mask alignment, limits."""

import pytest
import torch

from orchestrator.algo.advantages import compute_advantages
from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.envs.env import EnvStep
from orchestrator.envs.env_runner import EnvRunner
from orchestrator.rollout.multiturn import TrajectoryBuilder
from orchestrator.rollout.router import StickyRouter

# Case C07's toy vocabulary with a greedy longest-match encoder.
VOCAB = {"h": 1, "e": 2, "l": 3, "o": 4, "he": 5, "llo": 6, "hello": 7}
INV = {v: k for k, v in VOCAB.items()}


def toy_encode(text):
    ids, i = [], 0
    while i < len(text):
        piece = max((p for p in VOCAB if text.startswith(p, i)), key=len)
        ids.append(VOCAB[piece])
        i += len(piece)
    return ids


def toy_decode(ids):
    return "".join(INV[i] for i in ids)


class ToySession:
    def __init__(self, messages):
        self.prompt_ids = toy_encode("".join(m["content"] for m in messages))

    def action_text(self, ids):
        return toy_decode(ids)

    def observation_ids(self, context_ids, ids, messages):
        return toy_encode("".join(m["content"] for m in messages))


class ToyRenderer:
    def start(self, messages):
        return ToySession(messages)


class EchoEnv:
    """Replies "o" after the first turn, ends after the second with reward 1."""

    def reset(self, sample):
        self.turns = 0
        return "he"

    def step(self, action):
        self.turns += 1
        return EnvStep("o", 0.0, False, {}) if self.turns < 2 else EnvStep("", 1.0, True, {})


class ScriptedEngine:
    """Samples [5, 6] with logprobs [-0.7, -1.2] every turn and records every prompt."""

    def __init__(self):
        self.prompts = []

    async def generate(self, prompt_ids, max_tokens, worker):
        self.prompts.append(list(prompt_ids))
        return [5, 6], [-0.7, -1.2], "stop"


def test_c07_sampled_ids_are_kept_not_re_encoded():
    assert toy_encode(toy_decode([5, 6])) == [7]  # the fault this case guards against
    engine = ScriptedEngine()
    loop = AgentLoop(engine, EnvRunner(EchoEnv), ToyRenderer(), StickyRouter(1), AgentLoopConfig(max_turns=4))
    (traj,), metrics = loop.run_sync([GroupRequest(0, {}, n=1)])
    prompt = toy_encode("he")
    assert prompt == [5]
    assert traj.prompt_ids == [5]
    assert traj.response_ids == [5, 6, 4, 5, 6]
    assert traj.loss_mask == [1, 1, 0, 1, 1]
    assert traj.logprobs == [-0.7, -1.2, 0.0, -0.7, -1.2]
    first_turn = traj.logprobs[slice(*traj.turn_spans[0])]
    assert first_turn == [-0.7, -1.2] and sum(first_turn) == pytest.approx(-1.9)
    # the next turn's prompt is the previous prompt + the sampled ids + the observation's ids
    assert engine.prompts == [[5], [5, 5, 6, 4]]
    assert 7 not in traj.response_ids
    assert traj.stop_reason == "done" and not traj.truncated and traj.reward == 1.0
    assert metrics["rollout/turns_mean"] == 2.0


def test_loss_mask_and_logprobs_align_with_trained_ids():
    b = TrajectoryBuilder(3, [10, 11, 12], max_tokens=0)
    b.add_sampled([20, 21, 22], [-0.1, -0.2, -0.3])
    assert b.add_observation([30, 31])
    b.add_sampled([23], [-0.4])
    b.add_reward(0.0)
    b.add_reward(1.0)
    t = b.finish("done")
    assert t.response_ids == [20, 21, 22, 30, 31, 23]
    assert len(t.loss_mask) == len(t.logprobs) == len(t.response_ids)
    assert t.trained_ids() == [20, 21, 22, 23]
    assert t.trained_logprobs() == [-0.1, -0.2, -0.3, -0.4]
    assert [lp for lp, m in zip(t.logprobs, t.loss_mask) if not m] == [0.0, 0.0]
    assert t.turn_spans == [(0, 3), (5, 6)]
    assert t.turn_rewards == [0.0, 1.0] and t.reward == 1.0
    flat = t.to_trajectory(weight_version=7)
    assert flat.response_ids == t.response_ids and flat.multiturn.loss_mask == [1, 1, 1, 0, 0, 1]
    assert flat.finish_reason == "stop" and flat.weight_version == 7 and flat.prompt_ids == [10, 11, 12]


def test_builder_rejects_bad_turns():
    b = TrajectoryBuilder(0, [1, 2], max_tokens=6)
    with pytest.raises(ValueError, match="as many logprobs"):
        b.add_sampled([3, 4], [-0.1])
    with pytest.raises(ValueError, match="finite and <= 0"):
        b.add_sampled([3], [float("nan")])
    with pytest.raises(ValueError, match="exceed the 4 tokens left of env.max_tokens=6"):
        b.add_sampled([3, 4, 5, 6, 7], [-0.1] * 5)
    b.add_sampled([3, 4], [-0.1, -0.1])
    assert not b.add_observation([9, 9, 9])  # 2 left: the observation does not fit, nothing is added
    assert b.context_ids == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="env.max_tokens=2"):
        TrajectoryBuilder(0, [1, 2], max_tokens=2)
    with pytest.raises(ValueError, match="stop_reason"):
        b.finish("weird")


class NeverDoneEnv:
    def reset(self, sample):
        return "he"

    def step(self, action):
        return EnvStep("llo", 0.0, False, {})


def test_max_turns_and_max_tokens_mark_truncation():
    engine = ScriptedEngine()
    loop = AgentLoop(engine, EnvRunner(NeverDoneEnv), ToyRenderer(), StickyRouter(1),
                     AgentLoopConfig(max_turns=3, max_tokens=100))
    (t,), m = loop.run_sync([GroupRequest(0, {}, n=1)])
    # 3 turns of [5, 6] with "llo" ([6]) between them, no observation after the last turn
    assert t.response_ids == [5, 6, 6, 5, 6, 6, 5, 6] and t.num_turns == 3
    assert t.stop_reason == "max_turns" and t.truncated and m["rollout/truncated_frac"] == 1.0
    # prompt 1 + turn 2 + obs 1 + turn 2 = 6; a 7-token limit leaves 1 < next observation + turn
    loop = AgentLoop(ScriptedEngine(), EnvRunner(NeverDoneEnv), ToyRenderer(), StickyRouter(1),
                     AgentLoopConfig(max_turns=10, max_tokens=6))
    (t,), _ = loop.run_sync([GroupRequest(0, {}, n=1)])
    assert t.prompt_ids + t.response_ids == [5, 5, 6, 6, 5, 6]
    assert t.stop_reason == "max_tokens" and t.truncated and t.to_trajectory().finish_reason == "length"


class BudgetEngine:
    """Samples max_tokens ids of 3 (cut off): records the budgets it was given."""

    def __init__(self):
        self.budgets = []

    async def generate(self, prompt_ids, max_tokens, worker):
        self.budgets.append(max_tokens)
        return [3] * max_tokens, [-0.5] * max_tokens, "length"


def test_engine_budget_is_the_smaller_of_turn_and_total_limits():
    engine = BudgetEngine()
    loop = AgentLoop(engine, EnvRunner(NeverDoneEnv), ToyRenderer(), StickyRouter(1),
                     AgentLoopConfig(max_turns=10, max_tokens=12, max_new_tokens=4))
    (t,), _ = loop.run_sync([GroupRequest(0, {}, n=1)])
    # prompt 1; turn 4 (5); obs 1 (6); turn 4 (10); obs 1 (11); turn min(4, 1) = 1 (12)
    assert engine.budgets == [4, 4, 1]
    assert len(t.prompt_ids) + len(t.response_ids) == 12 and t.stop_reason == "max_tokens"


def test_advantages_are_per_trajectory():
    b = [TrajectoryBuilder(g, [1]) for g in (0, 0, 1, 1)]
    for builder, rewards in zip(b, ([0.0, 1.0], [0.0], [0.5], [0.5])):
        builder.add_sampled([2], [-0.1])
        for r in rewards:
            builder.add_reward(r)
    ts = [x.finish("done") for x in b]
    adv = compute_advantages(torch.tensor([t.reward for t in ts]), torch.tensor([t.group_id for t in ts]), "grpo")
    # group 0: trajectory rewards [0+1, 0] -> (r - 0.5) / std_unbiased(0.7071) = +-0.7071; group 1: equal -> 0
    assert adv[0].item() == pytest.approx(0.70711, abs=1e-4) and adv[1].item() == pytest.approx(-0.70711, abs=1e-4)
    assert adv[2] == 0.0 and adv[3] == 0.0


def test_multiturn_modules_are_pure():
    import subprocess
    import sys
    modules = [f"rollout.{m}" for m in ("agent_loop", "chat_render", "multiturn", "router")] + \
        [f"envs.{m}" for m in ("env", "env_config", "env_runner", "tool_calls", "calculator", "guessing", "python_tool")]
    code = ("import sys\n" + "".join(f"import orchestrator.{m}\n" for m in modules) +
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'actors'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
