"""The GRPO controller: one step as a short sequence of named, timed phases over Ray actors.

    sample prompts -> generate (a group of n per prompt) -> reward -> reference logprobs
    -> advantages -> policy update (micro-batches) -> weight sync (verified) -> log, checkpoint

`GRPOController(cfg).run()` is the whole job; `python -m orchestrator <config.yaml> [key=value ...]`
calls it. The actors belong to `orchestrator.job.Job`; rollouts come from a `RolloutSource`
(orchestrator/rollout/source.py), metrics go to the `metrics.sinks` (orchestrator/metrics/registry.py); this
module reads top to bottom.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from omegaconf import OmegaConf

from orchestrator.algo import AdvantageInputs, TrainBatch, response_mask_tensor, sequence_abs_mean, token_rows
from orchestrator.checkpoint import checkpoint_due, prune_checkpoints, step_folder
from orchestrator.checkpoint.resume import resume_checkpoint, resume_line
from orchestrator.critic_step import CriticStep
from orchestrator.data import StatefulLoader, load_examples, render_row
from orchestrator.eval.runner import Evaluator
from orchestrator.guards import RunGuards
from orchestrator.job import Actors, Job
from orchestrator.memory.preflight import preflight
from orchestrator.metrics import METRICS_FILE, SinkContext, plot_run, read_jsonl
from orchestrator.metrics.phases import ROLE_PHASES, PhaseTimer, role_utilisation
from orchestrator.metrics.registry import build_sinks
from orchestrator.metrics.samples import ScoredBatch, log_completion_samples
from orchestrator.utils.models import resolve_model_path
from orchestrator.placement.elastic import ENGINES_KEY
from orchestrator.placement.drain import draining_nodes
from orchestrator.placement.elastic_pool import ElasticPool
from orchestrator.placement.modes import time_slice
from orchestrator.placement import replace
from orchestrator.reward.failures import check_reward_failures
from orchestrator.reward.overlong import add_overlong_penalty, overlong_filter_masks, overlong_filter_metrics
from orchestrator.reward.scorer import RewardResult
from orchestrator.rollout import PromptRequest, Trajectory
from orchestrator.config.rollout_mode import STREAM, mode_kind
from orchestrator.rollout.resume_mode import check_resumable, state_to_load
from orchestrator.rollout.dynamic_sampling import DynamicSampling, StepBatch, round_group_id
from orchestrator.rollout.pipeline import RolloutPipeline, rollout_pipeline
from orchestrator.rollout.multi_turn_source import MultiTurnSource, check_env
from orchestrator.rollout.seeds import group_seed
from orchestrator.rollout.single_turn import SingleTurnSource
from orchestrator.rollout.source import RolloutSource
from orchestrator.runtime.stopping import StopOnSignal
from orchestrator.runtime.supervisor import supervise


@dataclass
class RunResult:
    """Where a finished run left its outputs."""

    checkpoint: str
    metrics: str
    plot: str
    rows: list


class GRPOController:
    """Drives one GRPO run. Construct, then `run()`."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.out_dir = Path(cfg.run.output_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.out_dir / "config.yaml", resolve=True)  # the resolved run config, beside metrics.jsonl (rl-orch size reads it)
        self.model_path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
        # verified against its manifest, and of this model: else refused here, before any actor starts
        self.resume_from = resume_checkpoint(cfg.checkpoint, self.model_path, cfg.model.path)
        check_resumable(self.resume_from, cfg)  # pending rollouts of a mode this config cannot resume: refused now
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        examples = load_examples(cfg.data)
        # render every prompt once, now: an over-long row fails before any actor starts, naming the row
        self.prompt_ids = [render_row(self.tokenizer, cfg.data, ex.prompt, f"data.source={cfg.data.source!r} row {i}")
                           for i, ex in enumerate(examples)]
        self.evaluator = Evaluator(cfg, examples, self.tokenizer)  # eval.*: held-out prompts (orchestrator/eval)
        self.loader = StatefulLoader(self.evaluator.train_items, cfg.rollout.prompts_per_step, seed=cfg.data.seed,
                                     shuffle=cfg.data.shuffle)
        self.examples = examples
        self.metrics_path = self.out_dir / METRICS_FILE
        self.start_step, self.version = 0, 0
        self.last_checkpoint_t = time.monotonic()  # checkpoint.every_minutes counts from here
        self.loader_start = self.loader.state_dict()  # a restart before the first checkpoint rewinds to it
        self.last_checkpoint: Optional[str] = str(self.resume_from) if self.resume_from else None
        self.stop = StopOnSignal(cfg.run.stop_grace_s)  # installed by run()
        self.longest_prompt = max(map(len, self.prompt_ids), default=1)  # memory plan and trainer warm-up
        self.job = Job(cfg, self.model_path, self.pad_id, self.longest_prompt)
        self.critic = CriticStep(self.job, cfg)  # algo.estimator=gae: PPO's value model (orchestrator/critic_step.py)
        if cfg.env.name:  # multi-turn: the env resolves now, before any actor starts
            check_env(cfg)
        self.source: Optional[RolloutSource] = None  # made in run(), once the workers exist
        self.pipeline: Optional[RolloutPipeline] = None  # of rollout.mode (orchestrator/rollout/pipeline.py), run()
        self.guards = RunGuards(cfg)  # skipped updates in a row (run.max_skipped_updates), the guards.* section
        self.async_state: Optional[dict] = None  # a checkpoint's pending async batches, until the pipeline takes them
        self.reward_parts, self.scored = {}, None  # the last step's scored batch: completion samples (metrics.samples_*)
        self.sampling = DynamicSampling(cfg)  # algo.dynamic_sampling (orchestrator/rollout/dynamic_sampling.py)

    @property
    def actors(self) -> Optional[Actors]:
        """The job's actor handles (read-only; the job owns them)."""
        return self.job.actors

    # ---- the run --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Start the actors, run (or resume) to trainer.total_steps; returns where the outputs are.
        Raises MemoryPlanError (with the plan's table) before any actor starts when the run won't fit."""
        if self.cfg.memory.preflight:  # memory.force: a warning instead of the error
            preflight(self.cfg, self.model_path, self.longest_prompt)  # the lengths the trainer's warm-up runs
        self.job.start(self.resume_from)
        if self.resume_from is not None:
            self.restore(self.resume_from)
            print(resume_line(self.resume_from, self.start_step, self.cfg.trainer.total_steps), flush=True)
        self.start_rollouts()  # after the restore: nothing in flight at resume
        self.last_checkpoint_t = time.monotonic()
        with StopOnSignal(self.cfg.run.stop_grace_s) as self.stop:  # SIGTERM/SIGINT: RunStopped after a step
            supervise(self, self.run_steps)  # a dead trainer/reference/reward actor: restart from the checkpoint
        self.job.settle_sync()  # weight_sync.overlap: the last sync verified too
        if self.last_checkpoint is None:  # e.g. resumed at the final step: nothing new to save
            self.checkpoint(self.start_step)
        rows = self.rows()
        plot = plot_run(rows, self.out_dir / "reward_and_phases.png", title=self.cfg.run.name)
        return RunResult(checkpoint=str(self.last_checkpoint), metrics=str(self.metrics_path), plot=str(plot), rows=rows)

    def run_steps(self, extra: dict) -> None:
        """Steps start_step + 1 .. trainer.total_steps, each row (plus `extra`) into the metrics sinks (a resume
        or restart drops the logged rows past start_step). After a SIGTERM/SIGINT: RunStopped after the step (the
        last step finishes the run as usual)."""
        total = self.cfg.trainer.total_steps
        ctx = SinkContext(self.out_dir, self.cfg.run.name, total, self.start_step)
        save = self.checkpoint if self.cfg.checkpoint.on_signal else None
        with build_sinks(self.cfg, ctx) as sinks:
            self.evaluator.before_steps(self, lambda r: sinks.log_row({**r, **extra}))  # step 0: eval/* only
            pool = ElasticPool(self.job, self.rows()) if self.cfg.placement.elastic else None  # docs/elastic.md
            for step in range(self.start_step + 1, total + 1):
                row, ckpt = self.step(step)
                row.update(self.evaluator.after_step(self, step))  # eval.every_steps, the last step: eval/*
                self.last_checkpoint = ckpt or self.last_checkpoint
                if self.cfg.placement.auto and step == self.cfg.sizing.warmup_steps:
                    row.update(self._auto_replace(step, row, ckpt))
                if pool is not None and step < total:  # engines join or leave
                    row.update(pool.after_step(row))
                sinks.log_row({**row, **extra})
                log_completion_samples(sinks, self.cfg.metrics, step, self.scored, self.tokenizer)
                if step < total:  # a signal during the last step: the run is done anyway
                    self.stop.check(step, ckpt, save)

    def rows(self) -> list[dict]:
        """The rows logged so far (metrics.jsonl)."""
        return read_jsonl(self.metrics_path) if self.metrics_path.exists() else []

    def start_rollouts(self) -> None:
        """The rollout pipeline of rollout.mode (orchestrator/rollout/pipeline.py) over the rollout source of the job's
        workers (multi-turn when env.name is set); a resume's pending rollouts back in it."""
        kind = MultiTurnSource if self.cfg.env.name else SingleTurnSource
        self.source = kind(self.cfg, self.job.actors.rollout, self.job.wait, self.job.recover_rollout)
        per_group = self.score_group if not self.cfg.env.name or self.actors.reference is not None else None
        self.pipeline = rollout_pipeline(self.source, self.sample_prompts, self.loader, self.cfg, self.start_step,
                                         per_group, on_poll=self.job.pump_sync)
        if self.async_state:  # a resume: the checkpoint's generated, untrained groups (exact resume)
            self.pipeline.load_state_dict(self.async_state)
        self.async_state = None

    def step(self, step: int) -> tuple[dict, Optional[str]]:
        """One GRPO step over the rollout pipeline of rollout.mode (orchestrator/rollout/pipeline.py); returns the
        metrics row and the checkpoint folder if one was written. sync: this step's batch is generated now;
        one_step_off: step + 1's batch is launched before this step trains, on the weights the engines hold (bounded
        by algo.max_staleness), and waited for before the weight sync; stream: the engines generate throughout."""
        timer, row = PhaseTimer(), {"step": step}
        t0 = time.perf_counter()
        with timer.phase("sample"):  # and launch: this step's batch if none is in flight (and the next one's)
            self.pipeline.launch(step)
        # take the batch, score it; algo.dynamic_sampling: more rounds until it holds informative groups
        batch = self.sampling.batch(self, self.pipeline, step, self.version, timer, row)
        advantages, ref = self._score(batch, timer, row)
        with timer.phase("train"):  # streaming: the engines are drained while the trainer trains (`pump`)
            time_slice(self.job, "train", row)  # colocated: engines sleep (orchestrator/placement/modes.py)
            row.update(self.train(batch.trajs, advantages, ref))
        with timer.phase("generate"):  # one-step-off: the next batch's generation not hidden behind this step
            self.pipeline.finish_in_flight(row)
        with timer.phase("weight_sync"):  # streaming: overlapped with the next step (weight_sync.overlap)
            time_slice(self.job, "weight_sync", row)  # colocated: engines wake their weights
            self.sync_weights(step, row, overlap=mode_kind(self.cfg) == STREAM and self.cfg.weight_sync.overlap)
            self.pipeline.synced(step)
        return self._end_step(step, timer, row, t0)

    def _score(self, batch: StepBatch, timer: PhaseTimer, row: dict) -> tuple[list, Optional[list]]:
        """The reference and advantages phases of the scored batch: (advantages, reference logprobs or None)."""
        with timer.phase("reference"):
            ref = batch.reference if batch.reference is not None else self.reference_logprobs(batch.trajs)
        with timer.phase("advantages"):
            advantages = self.advantages(batch.trajs, batch.rewards, row)
        parts = {} if self.cfg.env.name else self.reward_parts
        self.scored = ScoredBatch(batch.trajs, batch.rewards, advantages, parts)
        return advantages, ref

    def _end_step(self, step: int, timer: PhaseTimer, row: dict, t0: float) -> tuple[dict, Optional[str]]:
        """Guards (orchestrator/guards: may stop the run), checkpoint (at the last step, every
        `checkpoint.every_steps`, after `checkpoint.every_minutes`), phase times, role busy/idle."""
        row.update(self.guards.after_step(step, row))
        ckpt, c = None, self.cfg.checkpoint
        with timer.phase("checkpoint"):
            if checkpoint_due(step, total_steps=self.cfg.trainer.total_steps, every_steps=c.every_steps,
                              every_minutes=c.every_minutes, seconds_since_last=time.monotonic() - self.last_checkpoint_t):
                ckpt = self.checkpoint(step)
        row.update(timer.times)
        row["timing/step_s"] = time.perf_counter() - t0
        row[ENGINES_KEY] = len(self.actors.rollout)  # the engine count at the end of the step (placement.elastic)
        if self.job.spares is not None:  # rollout.spare_workers: new ones where spares were taken; the warm ones
            # and spares on nodes being drained start again off them (an elastic run: after its engines left them)
            self.job.spares.refill(() if self.cfg.placement.elastic else draining_nodes())
            row["engines/spare"] = self.job.spares.ready()
        roles = tuple(r for r in ROLE_PHASES if r != "reference" or self.actors.reference is not None)
        # kept in the row: the sizer reads a stream run's generation from it (orchestrator/sizing/measurements.py)
        row.update(role_utilisation(row, roles, row.get("rollout/worker_generate_s_mean")))
        return row, ckpt

    # ---- phases ---------------------------------------------------------------------------------
    def sample_prompts(self, step: int, round_: int = 0) -> list[PromptRequest]:
        """The step's prompts (round `round_` of algo.dynamic_sampling), rendered with the chat template; group ids
        unique over the run; each group's sampling seed from (rollout.seed, step, group id) (rollout/seeds.py)."""
        out = []
        for i, k in enumerate(self.loader.next_batch()):
            ex, gid = self.examples[k], round_group_id(step, i, round_, self.cfg.rollout.prompts_per_step)
            out.append(PromptRequest(group_id=gid, prompt_ids=self.prompt_ids[k], answer=ex.answer, prompt=ex.prompt,
                                     seed=group_seed(self.cfg.rollout.seed, step, gid)))
        return out

    def score(self, trajs: list[Trajectory], row: dict, result: Optional[RewardResult] = None) -> list[float]:
        """Rewards of `trajs` (multi-turn: the environment's) and reward/* into `row`; `result`: the reward actor's
        result when already scored (streaming: per group, merged), else it is scored now."""
        env_rewards = self.source.rewards(trajs, row)  # multi-turn: the environment's (sum over turns)
        if env_rewards is not None:
            return env_rewards
        result = self.job.score(trajs) if result is None else result
        row.update(result.metrics)
        self.reward_parts = result.per_function  # each reward function's values (completion samples)
        check_reward_failures(result, self.cfg.reward, row["step"])  # past reward.max_failed_frac: stop, naming them
        row["reward/std"] = float(torch.tensor(result.rewards).std()) if len(result.rewards) > 1 else 0.0
        return add_overlong_penalty(result.rewards, trajs, self.cfg, row)  # reward.overlong_penalty (DAPO eq. 13)

    def reference_logprobs(self, trajs: list[Trajectory], block: bool = True):
        """Reference logprobs of `trajs`, [B][len(response_i)] (None without a reference); block=False: the ref."""
        if self.actors.reference is None:
            return None
        ref = self.actors.reference.logprobs.remote([t.prompt_ids for t in trajs], [t.response_ids for t in trajs])
        return self.job.wait(ref) if block else ref

    def score_group(self, trajs: list[Trajectory]) -> tuple:
        """Streaming: a complete group's reward scoring (none multi-turn: the environment's rewards) and reference
        logprobs, issued now: (ref or None, ref or None) (orchestrator/rollout/group_scores.py)."""
        reward = None if self.cfg.env.name else self.job.score(trajs, block=False)
        return reward, self.reference_logprobs(trajs, block=False)

    def advantages(self, trajs: list[Trajectory], rewards: list[float], row: dict) -> list[list[float]]:
        """Advantages per response token, [B][len(response_i)], by the registered `algo.estimator`
        (orchestrator/algo/advantages.py), from rollout group ids (never from prompt content, case C04);
        0 on multi-turn observation ids."""
        gids = torch.tensor([t.group_id for t in trajs], dtype=torch.long)
        r = torch.tensor(rewards, dtype=torch.float32)
        responses = [t.response_ids for t in trajs]
        mask = response_mask_tensor(responses, self._loss_masks(trajs))
        adv = self.critic.advantages(trajs, AdvantageInputs(r, gids, mask), row)  # the estimator; gae: the critic's values
        _, inverse = torch.unique(gids, return_inverse=True)
        groups = inverse.max().item() + 1
        mixed = sum(bool(r[inverse == g].max() > r[inverse == g].min()) for g in range(groups))
        row["rollout/groups_mixed_frac"] = mixed / groups
        row["actor/advantage_abs_mean"] = sequence_abs_mean(adv, mask)
        row.update(overlong_filter_metrics(trajs, self.cfg))  # algo.overlong_filter
        return token_rows(adv, responses)

    def _loss_masks(self, trajs: list[Trajectory]) -> Optional[list[list[int]]]:
        """Multi-turn: 1 on sampled ids, 0 on observation/template ids (never trained); None = all trained;
        algo.overlong_filter: 0 on every id of a truncated sample (orchestrator/reward/overlong.py)."""
        masks = [t.multiturn.loss_mask for t in trajs] if self.cfg.env.name else None
        return overlong_filter_masks(trajs, masks, self.cfg)

    def train(self, trajs: list[Trajectory], advantages: list[list[float]], ref) -> dict:
        """One policy update (and the critic's with gae); streaming: the engines are drained while it trains."""
        batch = TrainBatch(prompt_ids=[t.prompt_ids for t in trajs], response_ids=[t.response_ids for t in trajs],
                           rollout_logprobs=[t.logprobs for t in trajs], advantages=advantages, ref_logprobs=ref,
                           response_mask=self._loss_masks(trajs))
        critic = self.critic.start_update(batch)  # gae: the critic trains beside the policy (its own bundle)
        policy = self.job.wait(self.actors.trainer.train_step.remote(batch), self.pipeline.pump)  # stream: drains
        return {**policy, **self.critic.finish_update(critic)}

    def sync_weights(self, step: int, row: dict, overlap: bool = False) -> None:
        """Trainer -> every engine by `weight_sync.strategy`; then every engine's version and checksums
        must equal the trainer's; a failed verification is redone up to weight_sync.retries times (counted in
        sync/failures), then the step stops with an error naming the tensor group. overlap: verified while the
        next step trains (orchestrator/weight_sync/overlapped.py)."""
        row.update(self.job.sync_weights(step, overlap))
        self.version = step

    # ---- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self, step: int) -> str:
        """Trainer state, step, weight version and the prompt loader's position into
        `<checkpoint.dir>/step_<step>`; older checkpoints beyond checkpoint.keep_last are pruned."""
        folder, pipe = step_folder(self.cfg.checkpoint.dir, step), self.pipeline
        pending = pipe.loader_state() if pipe is not None else None  # async: before the pending batch's prompts
        extra = {"step": step, "weight_version": self.version, "loader": pending or self.loader.state_dict(),
                 "guards": self.guards.state_dict()}  # streaks and counters go on after a resume
        if self.pipeline is not None and (batches := self.pipeline.state_dict()):  # generated, not trained yet
            extra["async"] = batches
        self.last_checkpoint = path = self.job.checkpoint(folder, extra)
        prune_checkpoints(self.cfg.checkpoint.dir, self.cfg.checkpoint.keep_last)
        self.last_checkpoint_t = time.monotonic()
        return path

    def restore(self, folder: Path) -> None:
        """Trainer state, loader position and the pending rollouts this config resumes (another mode's are dropped
        or refused: orchestrator/rollout/resume_mode.py) from checkpoint `folder`, then a verified weight sync."""
        state = self.job.restore(folder)
        self.loader.load_state_dict(state["loader"])
        self.guards.load_state_dict(state.get("guards"))
        pending, note = state_to_load(state.get("async"), self.cfg, f"checkpoint {folder}")
        self.start_step, self.async_state = state["step"], pending
        if note:
            print(note, flush=True)
        self.sync_weights(self.start_step, {})

    # ---- placement.auto (the decision: orchestrator/placement/replace.py, pure) ----------------------
    def _auto_replace(self, step: int, row: dict, ckpt: Optional[str]) -> dict:
        """After step `sizing.warmup_steps`: `decide` on the logged rows plus this step's, print the decision,
        re-place when there is something to do. Returns the `sizing/*` fields of the step's row."""
        found, why = replace.decide([r for r in self.rows() + [row] if r.get("step", 0) <= step], self.cfg)
        print(why, flush=True)
        if found is None:
            return {"sizing/replaced": 0}
        fields = self._replace(step, found.overrides, ckpt)
        if fields["sizing/replaced"]:
            fields.update(replace.replacement_fields(found))
        return fields

    def _replace(self, step: int, overrides: dict, ckpt: Optional[str] = None) -> dict:
        """Checkpoint step `step` (or use `ckpt`), stop every actor, start them in the config with `overrides` (the old
        one again when the new placement cannot be reserved), restore, restart the rollouts. Returns {"sizing/replaced",
        "sizing/replace_s"} (+ "sizing/replace_failed" on the fallback). Raises, before anything stops, ConfigError for
        invalid overrides and ResumeModeError when the new config cannot resume the checkpoint's pending rollouts
        (orchestrator/rollout/resume_mode.py); past the checkpoint a failure carries a note naming it (kept on disk)."""
        t0 = time.perf_counter()
        old_cfg, new_cfg = self.cfg, replace.with_overrides(self.cfg, overrides)
        folder = Path(ckpt or self.checkpoint(step))
        try:
            check_resumable(folder, new_cfg)
            placed = self.restart(folder, new_cfg)
        except BaseException as e:
            e.add_note(f"placement.auto: the run's state after step {step} is in the checkpoint {folder}; "
                       f"resume with checkpoint.resume={folder}")
            raise
        fields = {"sizing/replaced": 1} if placed else {"sizing/replaced": 0, "sizing/replace_failed": 1}
        fields["sizing/replace_s"] = time.perf_counter() - t0
        if placed:
            OmegaConf.save(self.cfg, self.out_dir / f"config_replaced_step_{step}.yaml", resolve=True)
            print(f"placement.auto: re-placed after step {step} in {fields['sizing/replace_s']:.1f} s: "
                  f"{replace.describe_change(old_cfg, self.cfg, overrides)} (resumed from {folder})", flush=True)
        return fields

    def restart(self, folder: Optional[Path], new_cfg=None) -> bool:
        """Stop every actor, start them again from checkpoint `folder` (None: the base model at step 0) in `new_cfg`
        when given (the current config when not, or when it cannot be reserved), `restore` (a verified weight sync),
        restart the rollouts. Returns whether `new_cfg` runs. Used by placement.auto and orchestrator/runtime/supervisor.py."""
        if self.pipeline is not None:  # one_step_off, stream: pending batches are regenerated
            self.pipeline.discard()
        self.cfg, placed = self.job.replace(new_cfg or self.cfg, folder)
        if folder is None:
            self.loader.load_state_dict(self.loader_start)
            self.start_step, self.version = 0, 0
        else:
            self.restore(folder)  # trainer state + loader, then a verified weight sync to every engine
            self.last_checkpoint = str(folder)  # the supervisor may go back past a torn newer one
        self.start_rollouts()
        return placed

    def shutdown(self) -> None:
        """Stop every actor, and the local Ray when this run started it (idempotent)."""
        self.job.close()
