"""DAPO dynamic sampling (orchestrator/rollout/dynamic_sampling.py) against a fake controller and fake rollout
pipelines (a synchronous one that generates a round of prompts per call, a streamed one that hands out groups
already generated): no uniform group is trained while enough informative ones exist, the rounds and the loader
account for every prompt, max_rounds, per-group reference logprobs follow the groups kept."""
from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
from omegaconf import OmegaConf

from orchestrator.config import ConfigError, load_config
from orchestrator.rollout.dynamic_sampling import ROUND_STRIDE
from orchestrator.data import StatefulLoader
from orchestrator.rollout import PromptRequest, Trajectory
from orchestrator.rollout.dynamic_sampling import DynamicSampling, merge_round_rows, pooled_std, round_group_id

N = 4  # samples per group


class Timer:
    def __init__(self):
        self.calls: list[str] = []

    @contextmanager
    def phase(self, name):
        self.calls.append(name)
        yield


class FakeHost:
    """Prompts are ints; prompt k's group gets rewards `pattern(k)` (uniform or mixed)."""

    def __init__(self, num_prompts: int, pps: int, pattern, seed: int = 0):
        self.loader = StatefulLoader(list(range(num_prompts)), pps, seed=seed)
        self.pps, self.pattern, self.reward_parts = pps, pattern, {}
        self.drawn: list[tuple[int, int, int]] = []  # (step, round, prompt)

    def sample_prompts(self, step, round_=0):
        out = []
        for i, k in enumerate(self.loader.next_batch()):
            self.drawn.append((step, round_, k))
            out.append(PromptRequest(round_group_id(step, i, round_, self.pps), [k], str(k), prompt=str(k)))
        return out

    def generate(self, requests, row):
        row["rollout/tokens"] = row.get("rollout/tokens", 0) + 10 * len(requests)
        return [Trajectory(r.group_id, r.prompt_ids, [1] * (j + 1), [0.0] * (j + 1), "stop", prompt=r.prompt)
                for r in requests for j in range(N)]

    def score(self, trajs, row, result=None):
        rewards = [self.pattern(int(t.prompt))[j % N] for j, t in enumerate(trajs)]
        self.reward_parts = {"accuracy": list(rewards)}
        row["reward/mean"] = sum(rewards) / len(rewards)
        row["reward/std"] = float(torch.tensor(rewards).std())
        return rewards


class SyncPipeline:
    """rollout.mode sync / one_step_off as the filter sees them: round r of a step is a fresh draw of P prompts."""

    def __init__(self, host):
        self.host, self.calls = host, []

    def take(self, step, version, row):
        self.calls.append(("take", step))
        return self.host.generate(self.host.sample_prompts(step), row)

    def more(self, step, round_, version, row, groups):
        self.calls.append(("more", step, round_, groups))
        return self.host.generate(self.host.sample_prompts(step, round_), row)

    def scores(self, row):
        return None


def rollouts(sampler, host, step, timer, row):
    batch = sampler.batch(host, SyncPipeline(host), step, step - 1, timer, row)
    return batch.trajs, batch.rewards


def cfg(enabled=True, max_rounds=4, pps=4):
    return OmegaConf.create({"algo": {"dynamic_sampling": {"enabled": enabled, "max_rounds": max_rounds}},
                             "rollout": {"prompts_per_step": pps}})


def groups_of(trajs, rewards):
    out: dict[int, list[float]] = {}
    for t, r in zip(trajs, rewards):
        out.setdefault(t.group_id, []).append(r)
    return out


MIXED, UNIFORM = [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]


def test_never_trains_a_uniform_group_when_enough_informative_ones_exist() -> None:
    host = FakeHost(40, 4, lambda k: MIXED if k % 3 == 0 else UNIFORM, seed=1)
    sampler, row, timer = DynamicSampling(cfg(max_rounds=10)), {"step": 1}, Timer()
    trajs, rewards = rollouts(sampler, host, 1, timer, row)
    groups = groups_of(trajs, rewards)
    assert len(groups) == 4 and all(max(r) > min(r) for r in groups.values())
    informative_drawn = [k for _, _, k in host.drawn if k % 3 == 0]
    assert len(informative_drawn) >= 4
    assert row["rollout/dyn_groups_generated"] == len(host.drawn) == 4 * row["rollout/dyn_rounds"]
    assert row["rollout/dyn_groups_kept"] == 4 and row["rollout/dyn_groups_padded"] == 0
    # the first informative groups in generation order are the ones trained
    assert [int(trajs[i * N].prompt) for i in range(4)] == informative_drawn[:4]
    assert timer.calls == ["generate", "reward"] * row["rollout/dyn_rounds"]
    # the per-function values follow the trained batch (completion samples)
    assert host.reward_parts == {"accuracy": rewards}


def test_round_accounting_group_ids_and_loader_position() -> None:
    # prompts 0..7 in order (no shuffle): round 0 draws 0-3 (two informative), round 1 draws 4-7 (two more)
    host = FakeHost(8, 4, lambda k: MIXED if k in (1, 2, 5, 7) else UNIFORM)
    host.loader = StatefulLoader(list(range(8)), 4, shuffle=False)
    row = {"step": 3}
    trajs, rewards = rollouts(DynamicSampling(cfg()), host, 3, Timer(), row)
    assert row["rollout/dyn_rounds"] == 2 and row["rollout/dyn_groups_generated"] == 8
    assert [int(trajs[i * N].prompt) for i in range(4)] == [1, 2, 5, 7]
    assert sorted({t.group_id for t in trajs}) == [13, 14, 12 + 1 + ROUND_STRIDE, 12 + 3 + ROUND_STRIDE]
    assert host.loader.state_dict()["position"] == 8  # every prompt drawn moved the loader
    assert row["rollout/tokens"] == 80  # counts add over the rounds
    assert row["reward/mean"] == pytest.approx(sum(sum(MIXED if k in (1, 2, 5, 7) else UNIFORM) for k in range(8)) / 32)


def test_max_rounds_reached_trains_what_there_is_and_warns_once(capsys) -> None:
    host = FakeHost(100, 4, lambda k: MIXED if k == 0 else UNIFORM)
    host.loader = StatefulLoader(list(range(100)), 4, shuffle=False)
    sampler = DynamicSampling(cfg(max_rounds=3))
    row = {"step": 1}
    trajs, rewards = rollouts(sampler, host, 1, Timer(), row)
    assert row["rollout/dyn_rounds"] == 3 and row["rollout/dyn_groups_generated"] == 12
    assert row["rollout/dyn_groups_kept"] == 1 and row["rollout/dyn_groups_padded"] == 3
    assert len(trajs) == 4 * N  # the batch keeps its size: the informative group, then uniform ones in order
    assert [int(trajs[i * N].prompt) for i in range(4)] == [0, 1, 2, 3]
    assert "found 1 informative groups of 4 in max_rounds=3" in capsys.readouterr().out
    row2 = {"step": 2}
    rollouts(sampler, host, 2, Timer(), row2)
    assert row2["rollout/dyn_groups_kept"] == 0 and row2["rollout/dyn_groups_padded"] == 4
    assert capsys.readouterr().out == ""  # once


def test_off_is_one_draw_scored_by_the_controller() -> None:
    host = FakeHost(8, 4, lambda k: UNIFORM)
    row, timer = {"step": 2}, Timer()
    trajs, rewards = rollouts(DynamicSampling(cfg(enabled=False)), host, 2, timer, row)
    assert rewards == [1.0] * 16 and timer.calls == ["generate", "reward"] and len(trajs) == 16
    assert row["reward/mean"] == 1.0  # scored into the step's own row
    assert [t.group_id for t in trajs[::N]] == [8, 9, 10, 11]  # step * P + i, as without dynamic sampling
    assert not any(k.startswith("rollout/dyn_") for k in row)


def test_a_resumed_loader_gives_the_same_step() -> None:
    pattern = lambda k: MIXED if k % 2 else UNIFORM  # noqa: E731
    a = FakeHost(30, 4, pattern, seed=5)
    sampler = DynamicSampling(cfg())
    rollouts(sampler, a, 1, Timer(), {"step": 1})
    state = a.loader.state_dict()
    b = FakeHost(30, 4, pattern, seed=5)
    b.loader.load_state_dict(state)
    ta, ra = rollouts(sampler, a, 2, Timer(), {"step": 2})
    tb, rb = rollouts(DynamicSampling(cfg()), b, 2, Timer(), {"step": 2})
    assert [(t.group_id, t.prompt) for t in ta] == [(t.group_id, t.prompt) for t in tb] and ra == rb


def test_merge_round_rows_hand_values() -> None:
    rows = [{"step": 1, "rollout/tokens": 10, "rollout/truncated_frac": 0.5, "reward/mean": 1.0, "reward/std": 0.0,
             "memory/peak_gib": 2.0, "rollout/worker_generate_s_mean": 1.5, "reward/score_s": 0.25, "rollout/turns_max": 3},
            {"step": 1, "rollout/tokens": 30, "rollout/truncated_frac": 0.0, "reward/mean": 0.0, "reward/std": 0.0,
             "memory/peak_gib": 1.0, "rollout/worker_generate_s_mean": 2.0, "reward/score_s": 0.5, "rollout/turns_max": 2}]
    merged = merge_round_rows(rows, [2, 6])
    assert merged == {"rollout/tokens": 40, "rollout/truncated_frac": 0.125, "reward/mean": 0.25,
                      "reward/std": pytest.approx(math.sqrt(2 * 0.75 ** 2 + 6 * 0.25 ** 2) / math.sqrt(7)),
                      "memory/peak_gib": 2.0, "rollout/worker_generate_s_mean": 3.5, "reward/score_s": 0.75,
                      "rollout/turns_max": 3}
    assert merge_round_rows(rows[:1], [2]) == {k: v for k, v in rows[0].items() if k != "step"}


def test_pooled_std_equals_the_std_of_all_samples() -> None:
    a, b = [0.0, 1.0, 1.0, 0.5], [2.0, 0.0, 0.25]
    rows = [{"reward/mean": sum(x) / len(x), "reward/std": float(torch.tensor(x).std())} for x in (a, b)]
    assert pooled_std(rows, [4, 3]) == pytest.approx(float(torch.tensor(a + b).std()))


def test_config_takes_every_rollout_mode_and_checks_max_rounds() -> None:
    yaml = "configs/grpo_arith_cpu.yaml"
    for mode in ("sync", "one_step_off", "stream"):
        c = load_config(yaml, ["algo.dynamic_sampling.enabled=true", f"rollout.mode={mode}"])
        assert c.algo.dynamic_sampling.enabled and c.rollout.mode == mode
    with pytest.raises(ConfigError, match=r"algo.dynamic_sampling.max_rounds=0 must be in \[1, 1000\]"):
        load_config(yaml, ["algo.dynamic_sampling.max_rounds=0"])
    c = load_config(yaml, ["algo.dynamic_sampling.enabled=true", "placement.mode=colocated"])
    assert c.algo.dynamic_sampling.enabled and c.algo.dynamic_sampling.max_rounds == 4


class StreamPipeline:
    """rollout.mode stream as the filter sees it: complete groups handed out in completion order, `groups` at a time,
    each with its reference logprobs scored per group (`scores`)."""

    def __init__(self, pattern, pps):
        self.pattern, self.pps, self.next, self.asked, self.last = pattern, pps, 0, [], []

    def _groups(self, count):
        out = []
        for _ in range(count):
            k, self.next = self.next, self.next + 1
            out += [Trajectory(k, [k], [1] * (j + 1), [0.0] * (j + 1), "stop", prompt=str(k)) for j in range(N)]
        self.last = out
        return out

    def take(self, step, version, row):
        return self._groups(self.pps)

    def more(self, step, round_, version, row, groups):
        self.asked.append(groups)
        return self._groups(groups)

    def scores(self, row):
        from orchestrator.rollout.group_scores import BatchScores
        return BatchScores(None, [[-float(t.group_id)] * len(t.response_ids) for t in self.last])


def test_the_stream_takes_only_the_missing_groups_and_keeps_their_reference_logprobs() -> None:
    informative_ids = {1, 2, 5, 6, 9}
    pipe = StreamPipeline(None, 4)
    host = FakeHost(4, 4, lambda k: MIXED if k in informative_ids else UNIFORM)
    row = {"step": 1}
    batch = DynamicSampling(cfg(max_rounds=5)).batch(host, pipe, 1, 0, Timer(), row)
    # round 0: groups 0-3 (1, 2 informative) -> 2 missing: groups 4, 5 (5) -> 1 missing: group 6
    assert pipe.asked == [2, 1] and row["rollout/dyn_rounds"] == 3 and row["rollout/dyn_groups_generated"] == 7
    assert [t.group_id for t in batch.trajs[::N]] == [1, 2, 5, 6] and row["rollout/dyn_groups_padded"] == 0
    assert batch.reference == [[-float(t.group_id)] * len(t.response_ids) for t in batch.trajs]


def test_merged_rows_keep_staleness_and_the_pipelines_gauges_whole() -> None:
    rows = [{"rollout/staleness": 1, "async/staleness_max": 1.0, "async/buffer_groups": 3.0, "async/dropped_groups": 2.0,
             "async/staleness_1": 4.0},
            {"rollout/staleness": 0, "async/staleness_max": 0.0, "async/buffer_groups": 1.0, "async/dropped_groups": 2.0,
             "async/staleness_1": 2.0}]
    assert merge_round_rows(rows, [8, 4]) == {"rollout/staleness": 1, "async/staleness_max": 1.0,
                                              "async/buffer_groups": 1.0, "async/dropped_groups": 2.0,
                                              "async/staleness_1": 6.0}
