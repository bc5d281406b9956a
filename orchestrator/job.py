"""The job: the only object that owns the run's actor handles and placement groups.

    job = Job(cfg, model_path, pad_id)
    job.start(resume_from)                 # Ray, gang-scheduled placement groups, every actor, the weight syncer
    job.wait(job.actors.trainer.get_step.remote())   # ray.get bounded by run.phase_timeout_s
    job.sync_weights(version)              # verified trainer -> every engine (weight_sync.*)
    path = job.checkpoint(folder, extra)   # trainer state + `extra` (atomic), tokenizer files beside the policy
    state = job.restore(folder)            # trainer state back; returns `extra`
    job.replace(new_cfg, folder)           # re-place: stop everything, start `new_cfg`'s actors from `folder`
    job.replace_rollout(k, why)            # a lost rollout worker: a fresh one in its bundle, synced (docs/faults.md)
    k = job.add_rollout(why)               # one more engine, in a group of its own, synced (docs/elastic.md)
    job.retire_rollout(why, k)             # engine k (default: the last) leaves, its group freed
    job.shutdown()                         # every actor and placement group (Ray stays up)
    job.close()                            # shutdown(), then ray.shutdown() when the job started a local Ray

Lost rollout workers: `recover_rollout` (the rollout sources' hook) and `sync_weights` replace a worker whose
process died, or whose weight load hung past weight_sync.timeout_s, by a fresh actor in the same
placement-group bundle; it starts from the weights the job started from and is synced to the current
version before it samples. Every restart counts against `run.max_restarts` (RestartBudget, orchestrator/runtime/faults.py).

Without `run.ray_address` or RAY_ADDRESS a run starts its own local Ray (advertising `placement.fake_gpus`
`fake_gpu` resources when placement.resource=fake_gpu); with either, it joins that cluster (this is what
`ray job submit` gives the entrypoint). The groups and slots come from orchestrator/placement/plan.py,
the actors start in them by orchestrator/placement/start.py; pinned actors (fake GPUs) get their cores in
RL_ORCH_CPU_CORES (actors/pinning.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import ray

from orchestrator.critic_step import critic_checkpoint, restore_critic
from orchestrator.memory.preflight import longest_sequence
from orchestrator.runtime.faults import EnginesLost, RestartBudget, describe, is_actor_lost
from orchestrator.runtime.overlap import pump_until, refs_ready
from orchestrator.placement.groups import PlacementError, missing_resources, remove_groups, reserve_groups, wait_placed
from orchestrator.placement.config import engine_range
from orchestrator.placement.plan import GroupPlan, engine_group
from orchestrator.placement.spares import SpareEngines
from orchestrator.placement.start import Actors, start_actors, start_rollout_worker
from orchestrator.runtime.ray_connect import connect_ray
from orchestrator.weight_sync.overlapped import OverlappedSyncs

class Job:
    """The run's actors, placement groups and weight syncer, behind a small public surface (module docstring).

    Every actor call the controller, the rollout sources and the placement modes wait on goes through
    `wait` (a hung actor becomes a TimeoutError naming run.phase_timeout_s, never a hang)."""

    def __init__(self, cfg, model_path: Path, pad_id: int, longest_prompt: Optional[int] = None):
        self.cfg, self.model_path, self.pad_id = cfg, Path(model_path), pad_id
        self.longest_prompt = longest_prompt  # tokens: the trainer's warm-up shape (None: data.max_prompt_tokens)
        self.actors: Optional[Actors] = None
        self.syncer = None
        self.overlapped: Optional[OverlappedSyncs] = None  # weight_sync.overlap (streaming runs)
        self.spares: Optional[SpareEngines] = None  # rollout.spare_workers
        self.restarts = RestartBudget(cfg.run.max_restarts)  # over the whole run, every role
        self.version: Optional[int] = None  # the weight version every engine holds (None before the first sync)
        self.resume_from: Optional[Path] = None
        self.started_ray = False  # whether start() started a local Ray (close() shuts it down)
        self.reform_restarts = 0  # engines replaced when found lost while another one's replacement re-formed the group

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self, resume_from: Optional[Path] = None) -> None:
        """Reserve every placement group and start every actor (engines from `resume_from/policy` when set),
        then set up the weight syncer (`weight_sync.strategy`; `auto` asks the cost model)."""
        self.started_ray = connect_ray(self.cfg) or self.started_ray
        warm_up = (*longest_sequence(self.cfg, self.longest_prompt), self.cfg.rollout.n)  # the trainer's warm-up
        self.actors = start_actors(self.cfg, self.model_path, resume_from, self.pad_id, warm_up)
        self.resume_from, self.version = resume_from, None
        self.syncer = self._make_syncer()
        self.overlapped = OverlappedSyncs(self.syncer, self.cfg.weight_sync.retries)
        if self.cfg.rollout.spare_workers:  # warm engines that take a lost one's place (orchestrator/placement/spares.py)
            self.spares = SpareEngines(self.cfg, self.actors, self.model_path)
            self.spares.start()

    def replace(self, new_cfg, folder: Path) -> tuple[object, bool]:
        """Re-place: stop every actor and group, then start `new_cfg`'s from checkpoint `folder`. When the new
        placement cannot be reserved (PlacementError) the current config is started again from `folder`.
        Returns (the config now running, whether it is `new_cfg`). The caller restores `folder` after it."""
        old_cfg = self.cfg
        self.shutdown()
        try:
            self.cfg, placed = new_cfg, True
            self.start(folder)
        except PlacementError as e:
            print(f"placement.auto: the new placement cannot be reserved, back to the old one from {folder}: {e}",
                  flush=True)
            self.cfg, placed = old_cfg, False
            self.start(folder)
        return self.cfg, placed

    def shutdown(self) -> None:
        """Kill every actor and remove every placement group (idempotent)."""
        if self.actors is not None:
            self.actors.shutdown()
        self.actors, self.syncer, self.overlapped, self.spares = None, None, None, None
        self.reform_restarts = 0

    def close(self) -> None:
        """`shutdown()`, then `ray.shutdown()` when `start` started a local Ray: its raylet, GCS and agent
        processes end and free their ports (idempotent)."""
        try:
            self.shutdown()
        finally:
            if self.started_ray and ray.is_initialized():
                ray.shutdown()
            self.started_ray = False

    # ---- calls -------------------------------------------------------------------------------------------
    def wait(self, refs, pump: Optional[Callable[[], None]] = None):
        """ray.get with `run.phase_timeout_s`: a hung actor stops the run with an error, never a hang. `pump`: called
        between short waits until `refs` are ready, within the same timeout (orchestrator/runtime/overlap.py)."""
        timeout = self.cfg.run.phase_timeout_s
        try:
            left = timeout if pump is None else pump_until(lambda wait_s: refs_ready(refs, wait_s), pump, timeout)
            return ray.get(refs, timeout=left)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"an actor call did not return within run.phase_timeout_s={timeout:g}s "
                               "(see the per-step phase times for the phase that hung)") from None

    def score(self, trajs: list, block: bool = True):
        """The reward actor's RewardResult for `trajs` (their texts, gold answers and group ids; the prompts too
        when a reward model reads them: reward.model_path), within run.phase_timeout_s; block=False: its ObjectRef."""
        prompts = [t.prompt for t in trajs] if self.cfg.reward.model_path else None
        ref = self.actors.reward.score.remote([t.text for t in trajs], [t.answer for t in trajs],
                                              [t.group_id for t in trajs], prompts)
        return self.wait(ref) if block else ref

    def sync_weights(self, version: int, overlap: bool = False) -> dict:
        """Trainer -> every engine by `weight_sync.strategy`, verified (version and checksums); a failed
        verification is redone up to weight_sync.retries times. An engine that died or hung past
        weight_sync.timeout_s is replaced (`replace_rollout`) and the sync redone. overlap: return once the trainer
        has sent (orchestrator/weight_sync/overlapped.py: the engines load, are verified and released while the next
        step trains; `pump_sync`, `settle_sync`). Returns `sync/*` metrics with `sync/engine_restarts` (engines
        replaced during this sync, and since the last one while a replacement re-formed a collective group) and
        `faults/restarts_total` (over the run). Raises RestartsExhausted past
        run.max_restarts."""
        replaced, overlap = 0, overlap and not self.syncer.strategy.concurrent  # a collective: synchronous
        if not overlap:
            self.settle_sync()
        while True:
            try:
                metrics = (self.overlapped.start(version) if overlap
                           else self.syncer.sync_with_retries(version, self.cfg.weight_sync.retries))
                break
            except EnginesLost as e:  # the redone sync brings the replacements to `version`
                replaced += self._replace_lost(e, sync=False)
        self.version = version
        replaced, self.reform_restarts = replaced + self.reform_restarts, 0
        metrics.update({"sync/engine_restarts": replaced, "faults/restarts_total": self.restarts.used})
        return metrics

    def pump_sync(self) -> None:
        """Verify and release the engines of an overlapped sync whose calls have returned (does not wait)."""
        if self.overlapped is not None:
            self.overlapped.pump()

    def settle_sync(self, keep: bool = False) -> dict:
        """Wait for an overlapped sync in flight and verify it (before eval, a re-placement, the end of the run).
        Returns its `sync/*` metrics ({} when none was settled since the last sync started); keep=True (eval):
        returns {} and hands them to the next sync's row instead."""
        return self.overlapped.settle(keep) if self.overlapped is not None else {}

    def recover_rollout(self, k: int, error: BaseException):
        """The rollout sources' hook for a failed call on worker k: None when `error` does not say the actor
        is gone (the caller raises it); otherwise the handle of its replacement (`replace_rollout`)."""
        if not is_actor_lost(error):
            return None
        return self.replace_rollout(k, describe(error))

    def replace_rollout(self, k: int, why: str, sync: bool = True):
        """Replace rollout worker k (lost because `why`): spend one restart of run.max_restarts, kill it, start
        a fresh one in the same placement-group bundle (`_start_rollout_worker`), and
        connect it to the weight syncer; with `sync`, bring it to the engines' current version (verified).
        Returns the new handle. Raises RestartsExhausted past the budget,
        PlacementError when its bundle is not placed within placement.timeout_s, except for an engine that may leave
        (placement.elastic, above rollout.min_workers): it leaves the job (`retire_rollout`'s way: the last engine
        takes index k) and the handle now at k (else the first) is returned (its calls' groups go there). A collective strategy (nccl, gloo)
        re-forms its group with the fresh engine and syncs every engine (orchestrator/weight_sync/syncer.py)."""
        self.overlapped.forget(k)
        self.restarts.spend(f"rollout worker {k}", why)
        old = self.actors.rollout[k]
        ray.kill(old)  # a hung actor frees its bundle; a dead one: a no-op
        new = self.spares.take(k) if self.spares is not None else None  # a warm spare: at once
        how = "a spare took its place" if new is not None else "replaced"
        try:
            if new is None:
                new = self._start_rollout_worker(k)
        except PlacementError as e:
            if not self._may_leave():
                raise
            self._remove_engine(k)  # placement.elastic: the job goes on with one engine fewer
            n = len(self.actors.rollout)
            print(f"rollout worker {k} lost ({why}) and its placement group cannot be placed again ({e}); "
                  f"placement.elastic: going on with {n} engines", flush=True)
            return self.actors.rollout[k if k < n else 0]  # the engine that took index k, else the first
        self.actors.rollout[k] = new
        self.actors.all.remove(old)
        if new not in self.actors.all:
            self.actors.all.append(new)
        self._connect_engine(k, new, self.version if sync else None)
        print(f"rollout worker {k} lost ({why}): {how}, restart {self.restarts.used} of "
              f"run.max_restarts={self.restarts.max_restarts}", flush=True)
        return new

    def _connect_engine(self, k: int, handle, version: Optional[int]) -> None:
        """`syncer.replace_engine(k, handle, version)`; other engines found lost meanwhile (a collective group's
        re-formation reaches every engine) are replaced first, the last first, then it is done again."""
        while True:
            try:
                self.syncer.replace_engine(k, handle, version)
                return
            except EnginesLost as e:
                if not [j for j in e.engines if j != k and j < len(self.actors.rollout)]:
                    raise
                # reported with the next sync's sync/engine_restarts
                self.reform_restarts += self._replace_lost(e, sync=False, keep=handle)

    def _replace_lost(self, e: EnginesLost, sync: bool, keep=None) -> int:
        """Replace the engines `e` names, the highest index first (under placement.elastic an engine may leave and
        the last one take its index), skipping `keep` and any engine replaced since `e` was raised (inside another
        one's re-formation: counted there). Returns how many were replaced here."""
        rollout = self.actors.rollout
        held = {k: rollout[k] for k in e.engines if k < len(rollout)}
        done = 0
        for k in sorted(held, reverse=True):
            if k < len(rollout) and rollout[k] is held[k] and held[k] is not keep:
                self.replace_rollout(k, e.reasons[k], sync=sync)
                done += 1
        return done

    def add_rollout(self, why: str) -> int:
        """One more rollout worker (index R, the next) in a placement group of its own (`engine_group`), started from
        the weights the job started from, then connected to the weight syncer and synced to the engines' current
        version (verified, probed) before any rollout reaches it. Returns its index. Raises PlacementError when the
        cluster cannot hold its group within placement.timeout_s; any failure leaves the job as it was (the engine
        and its group removed). Between steps (a stream generates on: it sends the engine groups from the next poll on)."""
        self.settle_sync(keep=True)  # a stream's overlapped sync in flight: verified first (its engines by index)
        plan, pgs, k = self.actors.plan, self.actors.pgs, len(self.actors.rollout)
        g = len(plan.groups)  # its name: the group's index, unique among live groups (an engine index is not)
        group, slot = engine_group(self.cfg, g, g, prefix="rl-orch-engine")
        pgs.append(reserve_groups([group], self.cfg.placement.timeout_s, self.cfg.placement.resource)[0])
        plan.groups.append(group)
        plan.slots["rollout"].append(slot)
        new = None
        try:
            start_from = self.resume_from if self.version is None else None
            new = start_rollout_worker(self.cfg, plan, pgs, k, self.model_path, start_from)
            self.wait(new.ready.remote())
            self.actors.rollout.append(new)
            self.actors.all.append(new)
            self.syncer.add_engine(new, self.version)
        except BaseException:
            self._drop_last_engine(new)
            raise
        print(f"rollout worker {k} added ({why}): {k + 1} engines", flush=True)
        return k

    def retire_rollout(self, why: str, k: Optional[int] = None) -> int:
        """Rollout worker k (default: the last) leaves (`_remove_engine`: the last engine takes index k; a collective
        strategy re-forms its group without it). Returns k. Raises ValueError for the only engine. Between steps (a
        stream's engines generate on: its rollouts restart the leaving engine's groups on the others,
        orchestrator/rollout/stream_workers.py `fit`)."""
        k = len(self.actors.rollout) - 1 if k is None else k
        self.settle_sync(keep=True)
        self._remove_engine(k)
        print(f"rollout worker {k} retired ({why}): {len(self.actors.rollout)} engines", flush=True)
        return k

    def _may_leave(self) -> bool:
        """Whether a lost engine may leave the job when it cannot be restarted: placement.elastic and more than
        rollout.min_workers engines."""
        return bool(self.cfg.placement.elastic) and len(self.actors.rollout) > engine_range(self.cfg)[0]

    def _remove_engine(self, k: int) -> None:
        """Engine k leaves: the last engine takes index k (actor list and slot swapped; the syncer does the same),
        then `_drop_last_engine`. Raises ValueError for the only engine."""
        rollout, slots = self.actors.rollout, self.actors.plan.slots["rollout"]
        if len(rollout) < 2:
            raise ValueError(f"rollout worker {k} cannot leave: it is the only engine")
        last = len(rollout) - 1
        rollout[k], rollout[last] = rollout[last], rollout[k]
        slots[k], slots[last] = slots[last], slots[k]
        if self.overlapped is not None:  # an overlapped sync's state of the leaving engine, then of the moved one
            self.overlapped.forget(k)
            self.overlapped.renumber(last, k)
        self._drop_last_engine(rollout[last])

    def _drop_last_engine(self, handle) -> None:
        """Undo the last engine: out of the syncer and the actor lists, killed, its own placement group removed (an
        engine whose bundle is in the job group leaves the bundle reserved). Engines that a collective group's
        re-formation without it finds lost are replaced (and synced) after it is gone."""
        plan, lost = self.actors.plan, None
        if handle is not None:
            try:
                if handle in self.syncer.engines:
                    self.syncer.remove_engine(self.syncer.engines.index(handle))
            except EnginesLost as e:
                lost = e
            finally:
                for handles in (self.actors.rollout, self.actors.all):
                    if handle in handles:
                        handles.remove(handle)
                ray.kill(handle)
        if len(plan.slots["rollout"]) > len(self.actors.rollout):  # else its slot was never planned
            self._drop_last_slot()
        if lost is not None:
            self.reform_restarts += self._replace_lost(lost, sync=True)

    def _drop_last_slot(self) -> None:
        plan, pgs = self.actors.plan, self.actors.pgs
        slot = plan.slots["rollout"].pop()
        if slot.group == 0 or slot.group in {s.group for slots in plan.slots.values() for s in slots}:
            return  # a bundle of the job group (or of a group another actor uses) stays reserved
        remove_groups([pgs[slot.group]])
        if slot.group == len(plan.groups) - 1:  # the last group (engines join and leave last-in first-out)
            pgs.pop()
            plan.groups.pop()
        else:  # a group in the middle (a spare's, swapped in) keeps its index, asking for nothing now
            plan.groups[slot.group] = GroupPlan(f"{plan.groups[slot.group].name}-removed", [], "PACK")

    def _start_rollout_worker(self, k: int, tries: int = 3):
        """A fresh rollout worker k in its bundle, waited for: the bundle within placement.timeout_s (a lost
        node's bundle is re-placed by Ray when the cluster can hold it), the engine within run.phase_timeout_s.
        A replacement lost while it starts (its bundle was still on a node Ray had not yet found dead) is
        started again, `tries` times in all. Its engine loads the checkpoint the job started from only before the
        first sync, then the base model (synced to full, verified weights): checkpoint.keep_last may remove it."""
        start_from = self.resume_from if self.version is None else None
        for attempt in range(1, tries + 1):
            self._wait_bundle(k)
            new = start_rollout_worker(self.cfg, self.actors.plan, self.actors.pgs, k, self.model_path, start_from)
            try:
                self.wait(new.ready.remote())
                return new
            except Exception as e:  # noqa: BLE001 - only a lost replacement is started again
                if attempt == tries or not is_actor_lost(e):
                    raise
                print(f"the replacement of rollout worker {k} was lost while starting ({describe(e)}); "
                      "starting it again", flush=True)
        raise AssertionError("unreachable")

    def _wait_bundle(self, k: int) -> None:
        """Wait until rollout worker k's placement group is placed; PlacementError naming the resources the
        job lacks after placement.timeout_s."""
        plan, timeout = self.actors.plan, self.cfg.placement.timeout_s
        slot = plan.slots["rollout"][k]
        group = plan.groups[slot.group]
        if not wait_placed(self.actors.pgs[slot.group], timeout):
            lack = missing_resources([b for g in plan.groups for b in g.bundles], ray.cluster_resources())
            short = lack or "no more than the cluster has in total"
            raise PlacementError(
                f"rollout worker {k} cannot be restarted: its placement group {group.name} (bundles {group.bundles}) is "
                f"not placed again after placement.timeout_s={timeout:g}s (a lost node?); the job's resources "
                f"{{name: (asked, cluster total)}}: {short}. Add the missing resources, then resume from the last "
                "checkpoint (checkpoint.resume=auto)")

    def checkpoint(self, folder: Path, extra: dict) -> str:
        """Trainer state and `extra` into `folder` (written atomically and fsynced, the tokenizer files beside
        the policy so that `folder/policy` loads standalone, `manifest.json` last). Returns the folder."""
        if self.actors.critic is not None:  # and critic/, under the same manifest (orchestrator/critic_step.py)
            return critic_checkpoint(self, folder, extra)
        return self.wait(self.actors.trainer.save_checkpoint.remote(str(folder), extra))

    def restore(self, folder: Path) -> dict:
        """Trainer weights, optimizer, scheduler and RNG from `folder`; returns the checkpoint's `extra` state.
        The engines still hold what they started with: the caller syncs the weights next."""
        extra = self.wait(self.actors.trainer.load_checkpoint.remote(str(folder)))
        if self.actors.critic is not None:
            restore_critic(self, folder)
        return extra

    def _make_syncer(self):
        from orchestrator.weight_sync.choose import choose_for_config
        from orchestrator.weight_sync.syncer import make_syncer

        strategy = self.cfg.weight_sync.strategy
        if strategy == "auto":
            numel, nbytes = self.wait(self.actors.trainer.sync_size.remote(self.cfg.rollout.dtype))
            strategy, table = choose_for_config(self.cfg, numel, nbytes)
            among = " (rollout.engine=async_llm: among the strategies that load outside Ray)" \
                if self.cfg.rollout.engine == "async_llm" else ""
            print(f"weight_sync.strategy=auto -> {strategy}{among}\n{table}", flush=True)
        return make_syncer(self.cfg, self.actors.trainer, self.actors.rollout, strategy)
