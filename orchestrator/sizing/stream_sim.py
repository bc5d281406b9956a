"""Stream mode of the pipeline simulator: fully asynchronous training with partial rollouts and k-step
staleness (rollout.mode=stream, algo.max_staleness=k;
orchestrator/rollout/stream_source.py, actors/rollout/stream.py). Pure Python.

    r = simulate_stream(StepCosts(generate_s=10, train_s=6, sync_s=1), k=2)   # r.step_s -> 11.0
    r = choose_k(costs, max_k=4, tolerance=0.02, generate_scale=(0.5, 1.5))   # r.k, r.step_by_k

The model (a fluid approximation of continuous batching: the engines work through batches in order, at
the throughput that one whole batch's generation measures):
- generation is continuous: batch j's generation starts when batch j-1's ends, as soon as fewer than k + 1
  batches are ahead of the trainer's weight version (the AReaL capacity rule: at most (version + k + 1) x P
  groups started; Fu et al. 2025, "AReaL"), i.e. when sync_{j-k-1} has ended;
- a weight sync never waits for a generation to end: it starts when the trainer is done (train_m, critic_m)
  and pauses the rollout GPUs for its own duration (transfer + load), then for recompute_s (the re-prefill
  of the interrupted requests' tokens) when it interrupted a generation; batch j's generation is the
  time it has worked, generate_s x generate_scale[j], stretched over those pauses (one 'generate_j' phase
  per stretch between pauses, each with the weight version it ran under);
- reward_j / reference_j need generate_j, train_j needs both, sync_j needs train_j (and critic_j),
  checkpoint_j follows sync_j; the trainer runs [reference_j], train_j, sync_j, checkpoint_j in order;
- an overlapped sync (weight_sync.overlap, costs.sync_hidden_s > 0): the trainer holds only its send
  ('send_j', sync_s - sync_hidden_s) and goes on; the rollout GPUs generate during the send and are paused
  for the rest (sync_hidden_s: load, checks, probe) from its end, and sync_j starts no earlier than sync_{j-1} ends
  (one sync in flight: orchestrator/weight_sync/overlapped.py).

Batch j is trained by train_j on version j - 1 and its first tokens come from version >= j - 1 - k, so the
staleness never exceeds k. With the same costs every step the period is the overlap limit
max(generate + sync + recompute, reference on trainer + train + send + checkpoint, reward, ...) once the chain
of one batch, (generate + max(reward, reference) + train + sync) / (k + 1), is below it; k = 1 already
achieves that when reward and reference take no longer than the sync: (G + T + S) / 2 <= max(G + S, T + S).
A larger k pays when generation times vary from step to step (a slow batch is absorbed by the batches
generated ahead) or when that chain is long (a slow reward) - `choose_k` picks the smallest k within a
tolerance of the best.
"""
from __future__ import annotations

from orchestrator.utils.finite import nonnegative_problem
from orchestrator.sizing.phases import (CYCLICITY, Phase, SimResult, StepCosts, check_scale, measure, scale_at,
                                        window_steps)


def _check(k: int, reference: str | None, steps: int | None) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (algo.max_staleness): must be an integer >= 1 (got {k!r})")
    if reference not in (None, "own", "trainer"):
        raise ValueError(f"reference: expected None, 'own' or 'trainer' (got {reference!r})")
    if steps is not None and steps < 1:
        raise ValueError(f"steps: must be >= 1 (got {steps})")


def _generate(j: int, t: float, work: float, pauses: list[tuple[float, float]], recompute_s: float,
              out: list[Phase]) -> tuple[float, float]:
    """Append batch j's generation, starting at t with `work` seconds to do, stretched over the rollout
    pauses (start, end) it meets; a pause that lands inside it adds recompute_s after the pause (a
    'recompute_j' phase). Returns (end of the generation, end of the last recompute, or 0)."""
    busy_until = 0.0
    for ws, we in pauses:
        if we <= t:
            continue
        if ws >= t + work:
            break
        if ws > t:  # the sync interrupts requests in flight: work done up to it, re-prefill after it
            out.append(Phase(f"generate_{j}", j, ws - t, ("rollout",), start=t, end=ws))
            work -= ws - t
            if recompute_s > 0:
                out.append(Phase(f"recompute_{j}", j, recompute_s, ("rollout",), start=we, end=we + recompute_s))
            t = busy_until = we + recompute_s
        else:  # the pause began before this batch could start
            t = max(t, we)
    out.append(Phase(f"generate_{j}", j, work, ("rollout",), start=t, end=t + work))
    return t + work, busy_until


def _timed(out: list[Phase], name: str, j: int, dur: float, res: tuple[str, ...], start: float) -> float:
    out.append(Phase(f"{name}_{j}", j, dur, res, start=start, end=start + dur))
    return start + dur


def build_stream_schedule(costs: StepCosts, steps: int, k: int, reference: str | None = None,
                          generate_scale: tuple[float, ...] = ()) -> list[Phase]:
    """The timed phases of `steps` steps in stream mode with staleness bound k (see the module docstring),
    and the generation of the k + 1 batches after them (the engines' work up to the last sync).

    reference: None, "own" (its own GPUs) or "trainer" (on the trainer's GPUs, before train_j).
    generate_scale: per-step multipliers of costs.generate_s (orchestrator.sizing.phases.scale_at).
    Raises ValueError naming k when k < 1 (or not an integer), naming reference / steps / generate_scale."""
    _check(k, reference, steps)
    scale = check_scale(generate_scale)
    c, out = costs, []
    free = {"trainer": 0.0, "cpu": 0.0, "reference": 0.0, "critic": 0.0}
    pauses: list[tuple[float, float]] = []
    sync_end: dict[int, float] = {}
    gen_end = recompute_end = 0.0
    for j in range(1, steps + k + 2):  # batches past `steps` keep the engines' work to the last sync timed
        start = max(gen_end, sync_end.get(j - k - 1, 0.0))  # capacity: fewer than k + 1 batches ahead
        while pauses and pauses[0][1] <= start:  # pauses over before this batch starts never matter again
            pauses.pop(0)
        gen_end, rec = _generate(j, start, c.generate_s * scale_at(scale, j), pauses, c.recompute_s, out)
        recompute_end = max(recompute_end, rec)
        if j > steps:
            continue
        free["cpu"] = _timed(out, "reward", j, c.reward_s, ("cpu",), max(gen_end, free["cpu"]))
        ready = [free["cpu"]]
        if reference is not None:
            res = "reference" if reference == "own" else "trainer"
            free[res] = _timed(out, "reference", j, c.reference_s, (res,), max(gen_end, free[res]))
            ready.append(free[res])
        free["trainer"] = _timed(out, "train", j, c.train_s, ("trainer",), max(ready + [free["trainer"]]))
        after = [free["trainer"]]
        if c.critic_s > 0:  # the critic trains on the same batch on its own device; the sync waits for it
            free["critic"] = _timed(out, "critic", j, c.critic_s, ("critic",), max(ready + [free["critic"]]))
            after.append(free["critic"])
        s0 = max(after + [recompute_end, sync_end.get(j - 1, 0.0)])
        if c.sync_hidden_s > 0:  # overlapped: the trainer sends and goes on, the engines load behind it
            free["trainer"] = s0 = _timed(out, "send", j, c.sync_on_trainer_s, ("trainer",), s0)
            sync_end[j] = _timed(out, "sync", j, c.sync_hidden_s, ("rollout",), s0)  # held from the send's end
        else:
            sync_end[j] = free["trainer"] = _timed(out, "sync", j, c.sync_s, ("trainer", "rollout"), s0)
        pauses.append((s0, sync_end[j]))
        free["trainer"] = _timed(out, "checkpoint", j, c.checkpoint_s, ("trainer",), free["trainer"])
    return out


def simulate_stream(costs: StepCosts, k: int, reference: str | None = None, steps: int | None = None,
                    generate_scale: tuple[float, ...] = ()) -> SimResult:
    """Stream mode's steady-state period (seconds per step, over the last steps; phases.measure), busy
    fractions and schedule with staleness bound k. Errors: see `build_stream_schedule`."""
    _check(k, reference, steps)
    scale = check_scale(generate_scale)
    n, m = (steps, max(1, steps // 2)) if steps else window_steps(k, len(scale), CYCLICITY)
    return measure("stream", build_stream_schedule(costs, n, k, reference, scale), n, m, "sync_", k)


def overlap_limit_s(costs: StepCosts, reference: str | None = None,
                    generate_scale: tuple[float, ...] = ()) -> float:
    """The fastest any overlap of generation and training can go (seconds per step): the busiest
    resource's work per step, max(mean generate + the sync's engine part (sync_on_rollout_s), reference on
    trainer + train + the sync's trainer part (sync_s - sync_hidden_s) + checkpoint, critic, reward, reference on its
    own GPUs). recompute_s is not counted (it is paid only when a sync interrupts a generation). Errors: a bad
    generate_scale (ValueError naming it)."""
    scale = check_scale(generate_scale)
    mean = sum(scale) / len(scale) if scale else 1.0
    c = costs
    on_trainer = c.reference_s if reference == "trainer" else 0.0
    own = c.reference_s if reference == "own" else 0.0
    return max(c.generate_s * mean + c.sync_on_rollout_s, on_trainer + c.train_s + c.sync_on_trainer_s + c.checkpoint_s,
               c.critic_s, c.reward_s, own)


def choose_k(costs: StepCosts, reference: str | None = None, max_k: int = 4, tolerance: float = 0.02,
             generate_scale: tuple[float, ...] = ()) -> SimResult:
    """Simulate k = 1..max_k and return the result of the smallest k whose step time is within `tolerance`
    (a fraction, e.g. 0.02 = 2%) of the best over those k, with step_by_k holding every simulated k's seconds
    per step. The search stops at the first k that reaches `overlap_limit_s` (a lower bound for every k).

    The smallest such k: a larger k admits older samples (more off-policy) for a gain under the tolerance.
    Raises ValueError naming max_k (< 1) or tolerance (< 0 or not finite), and see `build_stream_schedule`."""
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
        raise ValueError(f"max_k: must be an integer >= 1 (got {max_k!r})")
    if (why := nonnegative_problem(tolerance)) is not None:
        raise ValueError(f"tolerance: {why}")
    limit = overlap_limit_s(costs, reference, generate_scale)
    results: dict[int, SimResult] = {}
    for k in range(1, max_k + 1):
        results[k] = simulate_stream(costs, k, reference, None, generate_scale)
        if results[k].step_s <= limit * (1 + 1e-9):  # at the lower bound: no larger k can be faster
            break
    best = min(r.step_s for r in results.values())
    chosen = results[min(k for k, r in results.items() if r.step_s <= best * (1 + tolerance) + 1e-12)]
    chosen.step_by_k = {k: r.step_s for k, r in results.items()}
    return chosen
