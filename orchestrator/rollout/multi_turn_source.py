"""Multi-turn rollouts (`env.name` set): a rollout source whose groups run whole episodes against an environment.

    source = MultiTurnSource(cfg, workers, wait)     # resolves env.name: a bad name fails before any actor
    trajs = source.generate(requests, version, row)  # or launch / collect, as the async pipeline does
    rewards = source.rewards(trajs, row)             # the environment's rewards

launch: every group (one dataset row, `rollout.n` samples) is placed on a rollout worker by `StickyRouter`
(consistent hashing on the group id with a load cap, orchestrator/rollout/router.py); each worker runs all
samples and turns of its groups on its own engine (`generate_multiturn`: continuous batching, prefix
caching, environments in threads next to the engine). The episode's sample is
``{"prompt", "answer", "seed": group_id}`` from the step's dataset row. The router releases the groups
when their calls return (or fail).

rewards: a trajectory's reward is the sum of its turn rewards (``multiturn.reward``); the RewardActor's
functions are not called. Advantages stay per trajectory.

Failures (the policy of orchestrator/reward/failures.py): an env call that raises or times out ends its episode
(a failed step adds no reward; the turns before it keep theirs; a failed make/reset leaves no trajectory), counted
in env/errors (timeouts included) and env/timeouts; env/failed_frac = failed episodes / episodes of the batch, and
`collect` stops the run (TooManyFailuresError) when it exceeds env.max_failed_frac.

Metrics (into the step's row): rollout/turns_mean, rollout/turns_max, rollout/truncated_frac,
rollout/trajectories, env/step_s (mean seconds inside env.step), env/errors, env/timeouts,
env/reset_failures, env/failed_frac, env/actor_restarts (env.placement=actor), rollout/prefill_tokens_requested / _computed, rollout/prefix_cache_hit_rate,
rollout/tokens, rollout/tokens_per_s, rollout/worker<k>_tokens_per_s, rollout/response_len_mean
(sampled + observation ids), rollout/sampled_len_mean, router/groups_per_worker_max, reward/mean,
reward/std, reward/max, reward/min.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Optional

import torch
from omegaconf import OmegaConf

from orchestrator.runtime.faults import call_engine
from orchestrator.reward.failures import FailureTally, check_failed_frac
from orchestrator.rollout.agent_loop import GroupRequest
from orchestrator.envs.env import resolve_env_factory
from orchestrator.rollout.router import StickyRouter
from orchestrator.rollout.source import Launched, Recover, RolloutSource, Wait
from orchestrator.rollout.types import PromptRequest, Trajectory


def check_env(cfg) -> dict:
    """Resolve `env.name` and check `env.kwargs` against its signature (nothing is built); returns the `env`
    section as a dict. Raises ValueError naming env.name / env.kwargs."""
    _check_kwargs(resolve_env_factory(cfg.env.name, "env.name"), cfg.env)
    env = OmegaConf.to_container(cfg.env, resolve=True) if OmegaConf.is_config(cfg.env) else dict(vars(cfg.env))
    return dict(env)


class MultiTurnSource(RolloutSource):
    """Routes groups to rollout workers and collects environment rewards (see the module docstring).

    Raises ValueError (naming env.name) when the environment cannot be resolved.
    """

    def __init__(self, cfg, workers: list, wait: Wait, recover: Optional[Recover] = None):
        super().__init__(cfg, workers, wait, recover)
        self.env_cfg: dict = check_env(cfg)
        self.router = StickyRouter(len(self.workers))

    def route(self, requests: list[PromptRequest]) -> dict[int, list[dict]]:
        """{worker index: [group dicts]}; every group's n samples (and all their turns) on one worker."""
        self._fit_router()
        shards: dict[int, list[dict]] = {}
        for r in requests:
            w = self.router.assign(r.group_id)
            shards.setdefault(w, []).append(dataclasses.asdict(group_request(r, self.cfg.rollout.n)))
        return shards

    def _fit_router(self) -> None:
        """The router's workers are the job's engines now (placement.elastic adds engines last, and an engine that
        leaves takes the last index with it): indexes past the end are removed (their placed groups, none between
        the steps of a synchronous run, re-placed), new ones added. Groups stay sticky within a batch."""
        n = len(self.workers)
        for w in [w for w in self.router.workers if w >= n]:
            self.router.remove_worker(w)
        for w in range(n):
            if w not in self.router.loads():
                self.router.add_worker(w)

    def launch(self, requests: list[PromptRequest]) -> Launched:
        shards = self.route(requests)
        order = sorted(shards)
        sent_to = [self.workers[w] for w in order]
        refs = [self._call(w, shards[w]) for w in order]
        launched = Launched(requests, order, refs, payloads=[shards[w] for w in order], sent_to=sent_to)
        launched.meta["groups_per_worker_max"] = max((len(s) for s in shards.values()), default=0)
        return launched

    def _call(self, worker: int, payload: list[dict]):
        return call_engine(self.workers, worker, self.window, "generate_multiturn", payload, self.env_cfg, worker)

    def release(self, launched: Launched) -> None:
        for r in launched.requests:
            self.router.release(r.group_id)

    def collect(self, launched: Launched, expected_version: int, row: dict) -> list[Trajectory]:
        """As `RolloutSource.collect`, after the failure policy: ``env/failed_frac`` into `row`; TooManyFailuresError
        naming env.name past env.max_failed_frac; RuntimeError naming env.name when every reset failed."""
        results = self.fetch(launched)
        first = next((t.multiturn.env_error for ts, _ in results for t in ts if "error:" in t.multiturn.env_error), "")
        check_env_failures(env_failures(results, self.cfg.env.name, len(launched.requests) * self.cfg.rollout.n),
                           self.cfg.env, row.get("step", -1), first, row)
        if not any(ts for ts, _ in results):
            raise no_trajectory_error(self.cfg.env.name)
        return super().collect(launched, expected_version, row)

    def _metrics(self, launched: Launched, trajs: list[Trajectory]) -> dict:
        results = list(zip(launched.workers, (m for _, m in launched.results)))
        row = _rollout_metrics(trajs, results, len(self.workers))
        row["router/groups_per_worker_max"] = float(launched.meta["groups_per_worker_max"])
        return row

    def rewards(self, trajs: list[Trajectory], row: dict) -> list[float]:
        """Per-trajectory rewards from the environment (sum of turn rewards), and reward/* metrics."""
        rewards = [t.multiturn.reward for t in trajs]
        r = torch.tensor(rewards, dtype=torch.float64)
        row.update({"reward/mean": float(r.mean()), "reward/std": float(r.std()) if len(rewards) > 1 else 0.0,
                    "reward/max": float(r.max()), "reward/min": float(r.min())})
        return rewards


def group_request(r: PromptRequest, n: int) -> GroupRequest:
    """The episode group of one prompt request: n episodes of the sample {"prompt", "answer", "seed": group id}."""
    return GroupRequest(r.group_id, {"prompt": r.prompt, "answer": r.answer, "seed": r.group_id}, n, r.seed)


def env_failures(results: list, name: str, episodes: int) -> FailureTally:
    """The failed episodes of one batch from the workers' [(trajectories, metrics)]: an episode ends at its first
    failed env call (make, reset or step), so ``env/errors`` (timeouts included) counts failed episodes."""
    tally = FailureTally(calls=episodes)
    timeouts = sum(int(m.get("env/timeouts", 0)) for _, m in results)
    tally.add(name, "timeout", timeouts)
    tally.add(name, "error", sum(int(m.get("env/errors", 0)) for _, m in results) - timeouts)
    return tally


def check_env_failures(failures: FailureTally, env_cfg, step: int, first_error: str, row: dict) -> None:
    """The failure policy of one batch of episodes (orchestrator/reward/failures.py): ``env/failed_frac`` into `row`,
    then TooManyFailuresError naming env.name, the counts, `first_error` and what to do when it exceeds
    env.max_failed_frac. env_cfg: the `env` section (attributes or a dict: step_timeout_s, max_failed_frac)."""
    get = env_cfg.get if isinstance(env_cfg, dict) else lambda key: getattr(env_cfg, key)
    row["env/failed_frac"] = failures.failed_frac
    advice = {"timeout": f"make the environment faster or raise env.step_timeout_s (now {get('step_timeout_s'):g} s)",
              "error": "fix the environment's make/reset/step" + (f" (first error: {first_error})" if first_error else "")}
    check_failed_frac(failures, get("max_failed_frac"), step=step, advice=advice, what="environment episodes",
                      setting="env.max_failed_frac")


def no_trajectory_error(name: str) -> RuntimeError:
    """The error of a batch of episodes without a trajectory (every make/reset failed)."""
    return RuntimeError(f"multi-turn rollout returned no trajectory: every reset of env.name={name!r} failed "
                        "(see env/reset_failures and the worker logs)")


def _check_kwargs(factory, env_cfg) -> None:
    """The env's constructor must accept env.kwargs (checked on its signature, nothing is built).
    Raises ValueError naming env.kwargs and env.name."""
    kwargs = dict(env_cfg.kwargs or {})
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no introspectable signature (some C types): checked at the first reset
        return
    try:
        signature.bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"env.kwargs={kwargs} do not fit env.name={env_cfg.name!r}{signature}: {e}") from None


def _rollout_metrics(trajs: list[Trajectory], results: list[tuple[int, dict]], num_workers: int) -> dict:
    """Aggregate the workers' metrics: sums of counts, trajectory-weighted means of per-trajectory means."""
    n = len(trajs)
    weights = [m["rollout/trajectories"] for _, m in results]
    requested = sum(m["rollout/prefill_tokens_requested"] for _, m in results)
    computed = sum(m["rollout/prefill_tokens_computed"] for _, m in results)
    steps = [(m["env/step_s_mean"], m["rollout/turns_mean"] * w) for (_, m), w in zip(results, weights)]
    out = {
        "rollout/trajectories": float(n),
        "rollout/turns_mean": sum(t.multiturn.num_turns for t in trajs) / n,
        "rollout/turns_max": float(max(t.multiturn.num_turns for t in trajs)),
        "rollout/truncated_frac": sum(t.multiturn.truncated for t in trajs) / n,
        "rollout/response_len_mean": sum(len(t.response_ids) for t in trajs) / n,
        "rollout/sampled_len_mean": sum(sum(t.multiturn.loss_mask) for t in trajs) / n,
        "rollout/tokens": sum(m["rollout/tokens"] for _, m in results),
        "rollout/tokens_per_s": sum(m["rollout/tokens_per_s"] for _, m in results),
        "rollout/prefill_tokens_requested": requested,
        "rollout/prefill_tokens_computed": computed,
        "rollout/prefix_cache_hit_rate": (requested - computed) / requested if requested else 0.0,
        "rollout/in_flight_max": max(m["rollout/in_flight_max"] for _, m in results),
        # env/step_s: mean seconds of one env.step, weighted by the steps (about turns) each worker ran
        "env/step_s": sum(s * k for s, k in steps) / max(sum(k for _, k in steps), 1e-9),
        "env/errors": sum(m["env/errors"] for _, m in results),
        "env/timeouts": sum(m["env/timeouts"] for _, m in results),
        "env/reset_failures": sum(m["env/reset_failures"] for _, m in results),
        "rollout/worker_generate_s_mean": sum(m["rollout/generate_s"] for _, m in results) / len(results),
    }
    if any("env/actor_restarts" in m for _, m in results):  # env.placement=actor
        out["env/actor_restarts"] = sum(m.get("env/actor_restarts", 0.0) for _, m in results)
    for k in range(num_workers):  # per-worker throughput: imbalance shows up here (0 for an idle worker)
        out[f"rollout/worker{k}_tokens_per_s"] = next((m["rollout/tokens_per_s"] for w, m in results if w == k), 0.0)
    return out
