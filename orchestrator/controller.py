"""The GRPO controller: one step as a short sequence of named, timed phases over Ray actors.

    sample prompts -> generate (a group of n per prompt) -> reward -> reference logprobs
    -> advantages -> policy update (micro-batches) -> weight sync (verified) -> log, checkpoint

`GRPOController(cfg).run()` is the whole job; `python -m orchestrator <config.yaml> [key=value ...]`
calls it. Actors are created by `orchestrator.job.start_actors`; this module reads top to bottom.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import ray
import torch
from omegaconf import OmegaConf

from orchestrator.algo import compute_advantages
from orchestrator.async_rollouts import AsyncRollouts
from orchestrator.checkpoint import find_checkpoint, prune_checkpoints, step_folder
from orchestrator.data import StatefulLoader, load_examples, render_prompt_ids
from orchestrator.job import Actors, start_actors
from orchestrator.memory.preflight import preflight
from orchestrator.metrics import ConsoleProgress, JsonlLogger, plot_run, read_jsonl
from orchestrator.metrics.phases import ROLE_PHASES, role_utilisation
from orchestrator.metrics.prometheus import exporter_for
from orchestrator.models import resolve_model_path
from orchestrator.multiturn_phase import MultiTurnPhase
from orchestrator.placement_modes import time_slice
from orchestrator.replace import auto_replace
from orchestrator.rollout import PromptRequest, Trajectory
from orchestrator.weight_sync import WeightMismatchError
from orchestrator.weight_sync.syncer import WeightSyncer, choose_for_config, make_syncer


@dataclass
class RunResult:
    """Where a finished run left its outputs."""

    checkpoint: str
    metrics: str
    plot: str
    rows: list


class PhaseTimer:
    """Wall seconds per named phase of one step: `timing/<phase>_s`."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"timing/{name}_s"] = self.times.get(f"timing/{name}_s", 0.0) + time.perf_counter() - t0


class GRPOController:
    """Drives one GRPO run. Construct, then `run()`."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.out_dir = Path(cfg.run.output_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.out_dir / "config.yaml", resolve=True)  # the resolved run config, beside metrics.jsonl (rl-orch size reads it)
        self.model_path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
        self.resume_from = find_checkpoint(cfg.checkpoint.resume, cfg.checkpoint.dir)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        examples = load_examples(cfg.data)
        # render every prompt once, now: an over-long row fails before any actor starts, naming the row
        self.prompt_ids = [self._render(i, ex) for i, ex in enumerate(examples)]
        self.loader = StatefulLoader(list(range(len(examples))), cfg.rollout.prompts_per_step, seed=cfg.data.seed,
                                     shuffle=cfg.data.shuffle)
        self.examples = examples
        self.logger = JsonlLogger(self.out_dir / "metrics.jsonl")
        self.start_step, self.version = 0, 0
        self.actors: Optional[Actors] = None
        self.syncer: Optional[WeightSyncer] = None
        # env.name set: multi-turn rollouts and environment rewards (the env resolves now, before any actor)
        self.multiturn = MultiTurnPhase(cfg) if cfg.env.name else None
        self.rollouts: Optional[AsyncRollouts] = None  # placement.mode=disaggregated_async: made in run()

    def _render(self, i: int, ex) -> list[int]:
        d = self.cfg.data
        try:
            return render_prompt_ids(self.tokenizer, ex.prompt, d.system_prompt, d.max_prompt_tokens)
        except ValueError as e:
            raise ValueError(f"data.source={d.source!r} row {i}: {e}") from None

    # ---- the run --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Start the actors, run (or resume) to trainer.total_steps; returns where the outputs are.
        Raises MemoryPlanError (with the plan's table) before any actor starts when the run won't fit."""
        if self.cfg.memory.preflight:  # memory.force: a warning instead of the error
            longest_prompt = max(map(len, self.prompt_ids), default=0)
            if self.multiturn is not None:  # a trajectory holds up to env.max_tokens ids (prompt + every turn)
                longest_prompt = max(self.cfg.env.max_tokens - self.cfg.rollout.max_new_tokens, 1)
            preflight(self.cfg, self.model_path, longest_prompt)
        self.actors = start_actors(self.cfg, self.model_path, self.resume_from, self.pad_id)
        self.syncer = self._make_syncer()
        if self.resume_from is not None:
            self._restore(self.resume_from)
        if self.cfg.placement.mode == "disaggregated_async":  # after the restore: nothing in flight at resume
            self.rollouts = AsyncRollouts(self)
        self.logger.keep_steps_up_to(self.start_step)  # a fresh run starts a fresh log; a resume drops rows past it
        last_ckpt = None
        total = self.cfg.trainer.total_steps
        exporter = exporter_for(self.cfg.metrics, self.cfg.run.name)  # /metrics when metrics.prometheus_port > 0
        with exporter, ConsoleProgress(total, self.start_step, enabled=self.cfg.run.progress) as console:
            for step in range(self.start_step + 1, total + 1):
                row, ckpt = self.step(step)
                if self.cfg.placement.auto and step == self.cfg.sizing.warmup_steps:  # orchestrator/replace.py
                    row.update(auto_replace(self, step, row, ckpt))
                last_ckpt = ckpt or last_ckpt
                self.logger.log(row)
                exporter.observe(row)
                console.step(row)
        if last_ckpt is None:  # e.g. resumed at the final step: nothing new to save
            last_ckpt = str(self.resume_from) if self.resume_from else self._checkpoint(self.start_step)
        rows = read_jsonl(self.logger.path) if self.logger.path.exists() else []
        plot = plot_run(rows, self.out_dir / "reward_and_phases.png", title=self.cfg.run.name)
        return RunResult(checkpoint=last_ckpt, metrics=str(self.logger.path), plot=str(plot), rows=rows)

    def step(self, step: int) -> tuple[dict, Optional[str]]:
        """One GRPO step; returns the metrics row and the checkpoint folder if one was written."""
        if self.rollouts is not None:
            return self.step_async(step)
        timer, row = PhaseTimer(), {"step": step}
        t0 = time.perf_counter()
        with timer.phase("sample"):
            requests = self.sample_prompts(step)
        with timer.phase("generate"):
            trajs = self.generate(requests, row)
        advantages, ref = self._score(trajs, timer, row)
        with timer.phase("train"):
            time_slice(self, "train", row)  # colocated: engines sleep (orchestrator/placement_modes.py)
            row.update(self.train(trajs, advantages, ref))
        with timer.phase("weight_sync"):
            time_slice(self, "weight_sync", row)  # colocated: engines wake their weights
            self.sync_weights(step, row)
        return self._end_step(step, timer, row, t0)

    def step_async(self, step: int) -> tuple[dict, Optional[str]]:
        """One step of placement.mode=disaggregated_async (orchestrator/async_rollouts.py): the batch of
        step + 1 is launched before this step trains, on the weights the engines hold (one step off-policy,
        bounded by algo.max_staleness); its generation is waited for before the weight sync."""
        timer, row = PhaseTimer(), {"step": step}
        t0 = time.perf_counter()
        with timer.phase("sample"):  # and launch: this step's batch if none is in flight, and the next one
            self.rollouts.launch(step)
        with timer.phase("generate"):  # the wait for this step's batch (prefetched: usually ready)
            trajs = self.rollouts.take(step, row)
        advantages, ref = self._score(trajs, timer, row)
        with timer.phase("train"):
            row.update(self.train(trajs, advantages, ref))
        with timer.phase("generate"):  # the next batch's generation not hidden behind this step
            self.rollouts.finish_in_flight(row)
        with timer.phase("weight_sync"):
            self.sync_weights(step, row)
            self.rollouts.synced(step)
        return self._end_step(step, timer, row, t0)

    def _score(self, trajs: list[Trajectory], timer: PhaseTimer, row: dict) -> tuple[list[float], Optional[list]]:
        """The reward, reference and advantages phases of a step: (advantages, reference logprobs or None)."""
        with timer.phase("reward"):
            rewards = self.score(trajs, row)
        with timer.phase("reference"):
            ref = self.reference_logprobs(trajs)
        with timer.phase("advantages"):
            advantages = self.advantages(trajs, rewards, row)
        return advantages, ref

    def _end_step(self, step: int, timer: PhaseTimer, row: dict, t0: float) -> tuple[dict, Optional[str]]:
        """Checkpoint (every `checkpoint.every_steps` and at the last step), phase times, role busy/idle."""
        ckpt = None
        with timer.phase("checkpoint"):
            every = self.cfg.checkpoint.every_steps
            if step == self.cfg.trainer.total_steps or (every and step % every == 0):
                ckpt = self._checkpoint(step)
        row.update(timer.times)
        row["timing/step_s"] = time.perf_counter() - t0
        roles = tuple(r for r in ROLE_PHASES if r != "reference" or self.actors.reference is not None)
        row.update(role_utilisation(row, roles, row.pop("rollout/worker_generate_s_mean", None)))
        return row, ckpt

    # ---- phases ---------------------------------------------------------------------------------
    def _get(self, refs):
        """ray.get with `run.phase_timeout_s`: a hung actor stops the run with an error, never a hang."""
        timeout = self.cfg.run.phase_timeout_s
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"an actor call did not return within run.phase_timeout_s={timeout:g}s "
                               "(see the per-step phase times for the phase that hung)") from None

    def sample_prompts(self, step: int) -> list[PromptRequest]:
        """The step's prompts, rendered with the chat template; group ids unique over the run."""
        out = []
        for i, k in enumerate(self.loader.next_batch()):
            ex = self.examples[k]
            out.append(PromptRequest(group_id=step * self.cfg.rollout.prompts_per_step + i, prompt_ids=self.prompt_ids[k],
                                     answer=ex.answer, prompt=ex.prompt))
        return out

    def generate(self, requests: list[PromptRequest], row: dict) -> list[Trajectory]:
        """Whole groups per worker: request i goes to worker i mod R (all its n samples with it); multi-turn:
        groups placed by sticky routing, see orchestrator/multiturn_phase.py."""
        workers = self.actors.rollout
        if self.multiturn is not None:
            return self.multiturn.generate(workers, requests, self.version, row, self._get)
        return self._collect_generate(self._get(self._launch_generate(requests)), self.version, row)

    def _launch_generate(self, requests: list[PromptRequest]) -> list:
        """Submit the generate calls (request i to worker i mod R); returns their ObjectRefs, unwaited."""
        workers = self.actors.rollout
        shards = [requests[i :: len(workers)] for i in range(len(workers))]
        return [w.generate.remote(s) for w, s in zip(workers, shards) if s]

    def _collect_generate(self, results: list, expected_version: int, row: dict) -> list[Trajectory]:
        """Trajectories and `rollout/*` metrics from the workers' (trajectories, metrics). Raises
        WeightMismatchError when a sample's weight version is not `expected_version` (the engines'
        version at launch: the current one, or in disaggregated_async the scheduled stale one)."""
        trajs = [t for ts, _ in results for t in ts]
        stale = [t.weight_version for t in trajs if t.weight_version != expected_version]
        if stale:
            raise WeightMismatchError(f"rollout returned samples of weight version {stale[0]}, "
                                      f"expected {expected_version}")
        tokens = sum(m["rollout/tokens"] for _, m in results)
        lengths = [len(t.response_ids) for t in trajs]
        row["rollout/tokens"] = tokens
        row["rollout/tokens_per_s"] = sum(m["rollout/tokens_per_s"] for _, m in results)
        for k in ("rollout/prefill_tokens_requested", "rollout/prefill_tokens_computed"):
            row[k] = sum(m[k] for _, m in results)
        requested = row["rollout/prefill_tokens_requested"]
        # vLLM's prefix-cache hit rate over this step's prompt tokens (the n samples of a group share one prompt)
        row["rollout/prefix_cache_hit_rate"] = sum(m["rollout/prefix_cache_hits"] for _, m in results) / requested if requested else 0.0
        for k, (_, m) in enumerate(results):  # per-worker throughput: imbalance shows up here
            row[f"rollout/worker{k}_tokens_per_s"] = m["rollout/tokens_per_s"]
        row["rollout/worker_generate_s_mean"] = sum(m["rollout/generate_s"] for _, m in results) / len(results)
        row["rollout/response_len_mean"] = sum(lengths) / len(lengths)
        row["rollout/truncated_frac"] = sum(t.finish_reason == "length" for t in trajs) / len(trajs)
        for key in sorted({k for _, m in results for k in m if k.startswith("memory/")}):  # the largest engine
            row[key] = max(m.get(key, 0.0) for _, m in results)
        return trajs

    def score(self, trajs: list[Trajectory], row: dict) -> list[float]:
        if self.multiturn is not None:  # the environment's rewards (sum over turns)
            return self.multiturn.score(trajs, row)
        prompts = [t.prompt for t in trajs] if self.cfg.reward.model_path else None  # a reward model reads them
        result = self._get(self.actors.reward.score.remote([t.text for t in trajs], [t.answer for t in trajs],
                                                         [t.group_id for t in trajs], prompts))
        row.update(result.metrics)
        calls = len(self.cfg.reward.functions) * len({t.group_id for t in trajs})
        if result.metrics.get("reward/errors", 0) >= calls:
            raise RuntimeError(f"every reward function call of step {row['step']} raised ({calls} calls): the rewards "
                               "would all be 0; see the RewardActor's log above for the tracebacks")
        row["reward/std"] = float(torch.tensor(result.rewards).std()) if len(result.rewards) > 1 else 0.0
        return result.rewards

    def reference_logprobs(self, trajs: list[Trajectory]) -> Optional[list[list[float]]]:
        if self.actors.reference is None:
            return None
        return self._get(self.actors.reference.logprobs.remote([t.prompt_ids for t in trajs],
                                                             [t.response_ids for t in trajs]))

    def advantages(self, trajs: list[Trajectory], rewards: list[float], row: dict) -> list[float]:
        """Per-trajectory advantages from group ids (never from prompt content, case C04)."""
        gids = torch.tensor([t.group_id for t in trajs], dtype=torch.long)
        r = torch.tensor(rewards, dtype=torch.float32)
        adv = compute_advantages(r, gids, self.cfg.algo.estimator, self.cfg.algo.adv_eps)
        _, inverse = torch.unique(gids, return_inverse=True)
        groups = inverse.max().item() + 1
        mixed = sum(bool(r[inverse == g].max() > r[inverse == g].min()) for g in range(groups))
        row["rollout/groups_mixed_frac"] = mixed / groups
        row["actor/advantage_abs_mean"] = float(adv.abs().mean())
        return adv.tolist()

    def train(self, trajs: list[Trajectory], advantages: list[float], ref) -> dict:
        batch = {"prompt_ids": [t.prompt_ids for t in trajs], "response_ids": [t.response_ids for t in trajs],
                 "rollout_logprobs": [t.logprobs for t in trajs], "advantages": advantages, "ref_logprobs": ref,
                 # multi-turn: 1 on sampled ids, 0 on observation/template ids (never trained); None = all trained
                 "response_mask": ([t.extra["loss_mask"] for t in trajs] if self.multiturn is not None else None)}
        return self._get(self.actors.trainer.train_step.remote(batch))

    def _make_syncer(self) -> WeightSyncer:
        """The weight-sync strategy of `weight_sync.strategy`; `auto` asks the cost model (orchestrator.weight_sync)."""
        strategy = self.cfg.weight_sync.strategy
        if strategy == "auto":
            numel, nbytes = self._get(self.actors.trainer.sync_size.remote(self.cfg.rollout.dtype))
            strategy, table = choose_for_config(self.cfg, numel, nbytes)
            print(f"weight_sync.strategy=auto -> {strategy}\n{table}", flush=True)
        return make_syncer(self.cfg, self.actors.trainer, self.actors.rollout, strategy)

    def sync_weights(self, step: int, row: dict) -> None:
        """Trainer -> every engine by `weight_sync.strategy`; then every engine's version and checksums
        must equal the trainer's; a failed verification is redone up to weight_sync.retries times (counted in
        sync/failures), then the step stops with an error naming the tensor group."""
        row.update(self.syncer.sync_with_retries(step, self.cfg.weight_sync.retries))
        self.version = step

    # ---- checkpoints ----------------------------------------------------------------------------
    def _checkpoint(self, step: int) -> str:
        folder = step_folder(self.cfg.checkpoint.dir, step)
        # disaggregated_async: the loader before the pending batch's prompts (regenerated on resume)
        pending = self.rollouts.loader_state() if self.rollouts is not None else None
        extra = {"step": step, "weight_version": self.version, "loader": pending or self.loader.state_dict()}
        path = self._get(self.actors.trainer.save_checkpoint.remote(str(folder), extra))
        self._get(self.actors.trainer.save_tokenizer_files.remote(str(self.model_path), path))
        prune_checkpoints(self.cfg.checkpoint.dir, self.cfg.checkpoint.keep_last)
        return path

    def _restore(self, folder: Path) -> None:
        state = self._get(self.actors.trainer.load_checkpoint.remote(str(folder)))
        self.loader.load_state_dict(state["loader"])
        self.start_step = state["step"]
        self.sync_weights(self.start_step, {})  # verified: engines hold the checkpoint's weights

    def shutdown(self) -> None:
        if self.actors is not None:
            self.actors.shutdown()
