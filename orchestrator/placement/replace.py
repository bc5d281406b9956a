"""placement.auto: after `sizing.warmup_steps` steps, apply the sizer's recommendation by re-placing the actors.

    found, why = decide(rows, cfg)          # a Replacement (config overrides) or None, and why
    new_cfg = with_overrides(cfg, found.overrides)
    row.update(replacement_fields(found))  # what the step's row records

Pure (no Ray): the controller does the re-placement itself (GRPOController._replace; mechanics below).

Decision (`decide`, no Ray): the warm-up rows are measured as `rl-orch size` measures a metrics.jsonl
(orchestrator.sizing.measurements: first step dropped, medians), at the GPUs per role the current config
holds (`role_gpus`), and sized for `sizing.total_gpus` devices, or the devices the current placement holds
(`held_devices`), with `orchestrator.sizing.recommend.recommend`. The simulated candidates are taken shortest step
first; the first one this config can express becomes the overrides: rollout.num_workers (engines =
rollout GPUs / rollout.tensor_parallel_size), trainer.num_workers, the mode's keys (`mode_keys`: placement.mode and
rollout.mode; the sizer's stream mode is rollout.mode=stream + algo.max_staleness=k, k the one the sizer chose) and, on device resources (`placement.resource` other than CPU), the per-worker amounts
(`device_amounts`). Not expressible: a reference on other than its c devices or on the trainer's (the run has
c = trainer.context_parallel_size reference ranks, each with its own bundle), a streaming run leaving stream mode,
a stream k above the run's algo.max_staleness, a config that `validate` refuses (e.g. trainer ranks that do not
divide the mini-batch). Modes searched (`default_modes`): disaggregated; colocated when the run is colocated or
its rows measured the wake/sleep switch; async and stream only when the run already is one-step-off (they
change which weights sample); a streaming run (rollout.mode=stream) stream alone, k = 1 .. its
algo.max_staleness, its current step predicted at its own k (`current_step_s`).
None (nothing to do) when the measurement is insufficient (fewer than 2 timed rows: the first is warm-up),
when the sizer cannot size it, when the recommendation is the current placement, or when it is predicted
less than MIN_GAIN faster than the current one (a re-placement costs a checkpoint and an actor restart).

Mechanics (GRPOController._replace, orchestrator/controller.py): checkpoint the step (or use the one the
step just wrote) -> pending async batches discarded -> `Job.replace` (actors killed, placement groups
removed, the new config's actors and weight syncer started) -> `GRPOController.restore` (trainer weights,
optimizer, scheduler, RNG, loader; then a verified weight sync to every engine) -> rollouts restarted. When the new placement
cannot be reserved (PlacementError), the old config is started again from the same checkpoint; any other
failure propagates with a note naming the checkpoint, which stays on disk (checkpoint.resume=<it>).
Async -> stream: the one-step-off checkpoint's loader is before its pending batch's prompts, and the restore drops
that batch deliberately (orchestrator/rollout/resume_mode.py `state_to_load`), so the streaming pipeline draws those
prompts again: none lost or trained twice. Stream -> any other mode is refused (`to_overrides` here; and
`check_resumable` before anything stops): a streamed checkpoint's loader is past its untrained groups.
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import OmegaConf

from orchestrator.config.load import ConfigError, validate
from orchestrator.config.rollout_mode import STREAM, mode_kind
from orchestrator.placement.plan import reference_ranks
from orchestrator.sizing.measurements import MeasurementError, measure_rows, role_gpus, timed_rows
from orchestrator.sizing.stream_sim import simulate_stream
from orchestrator.sizing.workload import Split, Workload, evaluate

# sizer mode -> (placement.mode, rollout.mode); stream also sets algo.max_staleness=k (`mode_keys`)
CONFIG_MODE = {"colocated": ("colocated", "sync"), "disaggregated": ("disaggregated", "sync"),
               "async": ("disaggregated", "one_step_off"), "stream": ("disaggregated", "stream")}
SIZER_MODE = {config: sizer for sizer, config in CONFIG_MODE.items()}
# Re-place only when the recommendation is predicted at least this much faster (fraction of the current
# predicted step): a smaller gain does not pay for the checkpoint and actor restart (tens of seconds).
MIN_GAIN = 0.05
# colocated wake/sleep seconds of a step (orchestrator/placement/modes.py): the sizer's switch cost
SWITCH_KEYS = ("colocate/sleep_s", "colocate/wake_s")


@dataclass
class Replacement:
    """What `decide` recommends: config overrides (dotted key -> value), the sizer's split and its predicted
    step (seconds), the current placement's predicted step, the device total sized, and the fit's notes."""

    overrides: dict[str, Any]
    split: Split
    description: str
    predicted_step_s: float
    current_step_s: float
    total: int
    notes: list[str] = field(default_factory=list)


def held_devices(cfg) -> int:
    """Devices the current placement holds, counted as the sizer counts them (`role_gpus`): rollout engines x
    tensor-parallel size + trainer ranks + the reference's one (algo.kl_coef > 0); colocated: the shared
    devices, max(rollout, trainer)."""
    gpus, _ = role_gpus(cfg)
    if cfg.placement.mode == "colocated":
        return max(gpus["rollout"], gpus["trainer"])
    return sum(gpus.values())


def sizer_mode(cfg) -> str:
    """The run's mode as the sizer names it (SIZER_MODE of placement.mode and rollout.mode): colocated,
    disaggregated, async (rollout.mode=one_step_off) or stream (k = algo.max_staleness)."""
    return SIZER_MODE[(cfg.placement.mode, mode_kind(cfg))]


def current_split(cfg) -> Split:
    """The current placement as a sizer Split (see `held_devices`)."""
    gpus, _ = role_gpus(cfg)
    if cfg.placement.mode == "colocated":
        shared = held_devices(cfg)
        return Split("colocated", shared, shared, 0)
    return Split(sizer_mode(cfg), gpus["rollout"], gpus["trainer"], gpus["reference"])


def current_step_s(cfg, workload: Workload, split: Split) -> float:
    """The predicted seconds per step of the run as it is: `evaluate`, except that a streaming run is simulated
    at its own k = algo.max_staleness (orchestrator.sizing.stream_sim.simulate_stream), not at the k the
    sizer would choose."""
    if split.mode != "stream":
        return evaluate(workload, split).step_s
    return simulate_stream(workload.costs(split), cfg.algo.max_staleness, workload.reference_placement(split),
                           generate_scale=workload.generate_scale).step_s


def mode_keys(mode: str, k: Optional[int] = None) -> dict[str, Any]:
    """The config keys that select sizer mode `mode`: placement.mode and rollout.mode (CONFIG_MODE); stream adds
    algo.max_staleness=k (the k the sizer chose: required, an integer >= 1). Raises ValueError naming k."""
    placement, rollout = CONFIG_MODE[mode]
    out: dict[str, Any] = {"placement.mode": placement, "rollout.mode": rollout}
    if mode == "stream":
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k (algo.max_staleness of a stream split): must be an integer >= 1 (got {k!r})")
        out["algo.max_staleness"] = k
    return out


def device_amounts(cfg, mode: str) -> dict[str, float]:
    """Per-worker amounts of `placement.resource` for `mode` (sizer name): {} on CPU (the amounts are core
    shares the user chose, kept); on devices, separate modes give each trainer rank, rollout engine GPU and
    the reference one whole device; colocated keeps the configured amounts."""
    if cfg.placement.resource == "CPU" or mode == "colocated":
        return {}
    out = {"placement.trainer_per_worker": 1.0, "placement.rollout_per_worker": 1.0}
    if cfg.algo.kl_coef > 0:
        out["placement.reference_per_worker"] = 1.0
    return out


def with_overrides(cfg, overrides: dict[str, Any]):
    """A validated, read-only copy of `cfg` with `overrides` (dotted key -> value) applied; `cfg` is unchanged.
    Raises ConfigError (from `validate`) naming the key when the result is invalid."""
    new = copy.deepcopy(cfg)
    OmegaConf.set_readonly(new, False)
    for key, value in overrides.items():
        OmegaConf.update(new, key, value, merge=False)
    validate(new)
    OmegaConf.set_readonly(new, True)
    return new


def to_overrides(cfg, split: Split, k: Optional[int] = None) -> tuple[Optional[dict[str, Any]], str]:
    """(overrides, "") that realise `split` in this config, or (None, why it cannot be expressed). k: the
    staleness bound of a stream split (SimResult.k), required for it (`mode_keys`; ValueError without it).
    Not expressible: a streaming run (rollout.mode=stream) leaving stream mode (its checkpoint keeps
    the untrained groups as streamed requests, which only a streaming run resumes: the one-step-off pipeline
    cannot read them and a synchronous run would skip their prompts), a stream k above the run's
    algo.max_staleness (the staleness the run accepted), and any config `validate` refuses (e.g. streaming
    needs placement.mode=disaggregated, algo.max_staleness >= 1 and, with algo.old_logprobs=trainer, a
    staleness correction: orchestrator/config/rollout_mode.py, orchestrator/config/load.py `_check_async`)."""
    if mode_kind(cfg) == STREAM and split.mode != "stream":
        return None, (f"the run streams (rollout.mode=stream) and {split.mode} would drop the untrained "
                      "streamed groups its checkpoint holds")
    if split.mode == "stream" and isinstance(k, int) and k > cfg.algo.max_staleness:
        return None, (f"stream with k = {k} would admit samples older than algo.max_staleness="
                      f"{cfg.algo.max_staleness} allows")
    tp = cfg.rollout.tensor_parallel_size
    if split.rollout % tp:
        return None, f"{split.rollout} rollout GPUs are not a multiple of rollout.tensor_parallel_size={tp}"
    refs = reference_ranks(cfg)  # 1, or c context-parallel ranks (trainer.context_parallel_size), each its bundle
    if split.mode != "colocated" and refs and split.reference != refs:
        where = "on the trainer's devices" if split.reference == 0 else f"on {split.reference} devices"
        return None, (f"the reference {where}: the run has {refs} reference rank(s) "
                      f"(trainer.context_parallel_size), each with a bundle of its own")
    out = {**mode_keys(split.mode, k), "rollout.num_workers": split.rollout // tp,
           "trainer.num_workers": split.trainer, **device_amounts(cfg, split.mode)}
    try:
        with_overrides(cfg, out)
    except ConfigError as e:
        return None, str(e)
    return out, ""


def without_switch(row: dict) -> dict:
    """The row with the colocated sleep / wake seconds taken out of the train / weight-sync phase times that
    hold them (orchestrator/placement/modes.py), so the sizer counts them once, as its switch cost."""
    out = dict(row)
    for phase, key in (("timing/train_s", "colocate/sleep_s"), ("timing/weight_sync_s", "colocate/wake_s")):
        if phase in out and key in out:
            out[phase] = max(0.0, float(out[phase]) - float(out[key]))
    return out


def describe(split: Split, workload: Workload, k: int) -> str:
    """`Split.describe`, with ", k = <k>" for a stream split (k: its staleness bound, algo.max_staleness)."""
    return split.describe(workload) + (f", k = {k}" if split.mode == "stream" else "")


def default_modes(current: str, switch_measured: bool) -> tuple[str, ...]:
    """Sizer modes placement.auto searches from a run in sizer mode `current` (`sizer_mode`): disaggregated
    always; colocated when the run is colocated or its rows measured the wake/sleep switch (SWITCH_KEYS: the
    sizer counts an unmeasured switch as 0 s, which would always favour colocated); async and stream only when
    the run is already asynchronous (rollout.mode one_step_off; they change which weights sample: the run accepted samples up to
    algo.max_staleness versions old). A streaming run searches stream alone (`to_overrides`: it cannot leave
    stream mode without dropping its untrained groups). The current mode is always included."""
    if current == "stream":
        return ("stream",)
    modes = ["disaggregated"]
    if current == "colocated" or switch_measured:
        modes.insert(0, "colocated")
    if current == "async":
        modes += ["async", "stream"]
    return tuple(modes)


def decide(rows: list[dict], cfg, modes: Optional[tuple[str, ...]] = None) -> tuple[Optional[Replacement], str]:
    """The re-placement for the warm-up `rows` (metrics rows, `timing/*_s` seconds) of a run with config `cfg`
    (see the module docstring), and one line saying what was decided and why. `modes` (sizer names:
    colocated, disaggregated, async, stream) overrides the modes searched. Stream mode tries k = 1 ..
    max(1, algo.max_staleness) (never a staleness bound above the run's). Returns (None, why) when nothing is to do."""
    from orchestrator.sizing.recommend import recommend  # pure

    current = current_split(cfg)
    total = cfg.sizing.total_gpus or held_devices(cfg)
    try:
        timed = timed_rows(rows, "the warm-up metrics rows")
    except MeasurementError as e:
        return None, f"placement.auto: not re-placing: {e}"
    if len(timed) < 2:
        return None, (f"placement.auto: not re-placing: {len(timed)} timed step(s) measured and the first is "
                      "warm-up (dropped); set sizing.warmup_steps >= 2")
    gpus, extra = role_gpus(cfg)
    switch = [sum(float(r.get(k, 0.0)) for k in SWITCH_KEYS) for r in timed[1:] if any(k in r for k in SWITCH_KEYS)]
    run = measure_rows([without_switch(r) for r in timed], gpus, f"steps 1-{len(rows)} of this run",
                       "the run's config", extra)
    if modes is None:
        modes = default_modes(current.mode, bool(switch))
    bound = max(1, cfg.algo.max_staleness)
    try:
        sizing, workload, notes = recommend([run], total, modes, switch_s=statistics.median(switch) if switch else 0.0,
                                            rollout_unit=cfg.rollout.tensor_parallel_size, staleness=bound,
                                            max_k=bound)
        now = current_step_s(cfg, workload, current)
    except ValueError as e:  # MeasurementError, SizingError, FitError
        return None, f"placement.auto: not re-placing: the sizer cannot size this run: {e}"
    skipped = []
    for cand in sizing.ranked:
        overrides, why = to_overrides(cfg, cand.split, cand.result.k)
        label = describe(cand.split, workload, cand.result.k)
        if overrides is None:
            skipped.append(f"{label} ({why})")
            continue
        found = Replacement(overrides, cand.split, label, cand.step_s, now, total, notes)
        if cand.split == current or all(OmegaConf.select(cfg, k) == v for k, v in overrides.items()):
            return None, (f"placement.auto: not re-placing: the current placement "
                          f"({describe(current, workload, cfg.algo.max_staleness)}, predicted "
                          f"{now:.3g} s per step) is the sizer's recommendation for {total} devices")
        if cand.step_s > now * (1 - MIN_GAIN):
            return None, (f"placement.auto: not re-placing: the best placement for {total} devices "
                          f"({found.description}) is predicted {cand.step_s:.3g} s per step against "
                          f"{now:.3g} s now, less than {MIN_GAIN:.0%} faster")
        return found, (f"placement.auto: re-placing to {found.description}: predicted {cand.step_s:.3g} s per step "
                       f"(now {now:.3g} s) on {total} devices")
    return None, (f"placement.auto: not re-placing: no simulated placement can be expressed in this config: "
                  f"{'; '.join(skipped[:3])}")


def replacement_fields(found: Replacement) -> dict:
    """The `sizing/*` fields a re-placement adds to its step's row: `sizing/predicted_step_s` and
    `sizing/previous_predicted_step_s` (seconds), `sizing/split` (text), `sizing/{rollout,trainer,reference}_gpus`."""
    s = found.split
    return {"sizing/predicted_step_s": found.predicted_step_s, "sizing/split": found.description,
            "sizing/previous_predicted_step_s": found.current_step_s, "sizing/rollout_gpus": s.rollout,
            "sizing/trainer_gpus": s.trainer, "sizing/reference_gpus": s.reference}


def describe_change(old_cfg, new_cfg, overrides: dict[str, Any]) -> str:
    """"key=value, ..." of the overridden keys whose value changed, or "nothing changed"."""
    changed = ", ".join(f"{k}={OmegaConf.select(new_cfg, k)}" for k in overrides
                        if OmegaConf.select(old_cfg, k) != OmegaConf.select(new_cfg, k))
    return changed or "nothing changed"
