"""Fault-injection benchmark (issue 17): a GRPO run on the default model with faults on a schedule, against an
uninterrupted run of the same config.

Both runs: the default config (SmolLM2-135M-Instruct, arithmetic, fp32 on CPU), 22 steps of 2 prompts x 4
samples x 32 new tokens, a checkpoint every 3 steps, on a Ray cluster of four raylets on this machine
(`ray.cluster_utils.Cluster`: the head holds the controller's reward actor; three nodes with one custom `slot`
each hold the trainer, the rollout worker and a spare). The schedule (SCHEDULE):

    step 2   a reward function hangs on every call         (data fault: scored 0, reward/timeouts)
    step 3   the rollout worker's process is SIGKILLed      after its groups were launched
    step 5   the loss is NaN                                 (data fault: the update is skipped)
    step 6   the engine hangs in the weight sync            (inject_hang_next_load; weight_sync.timeout_s=30)
    step 8   the rollout worker is SIGKILLed again
    step 10  a reward function allocates 30 GiB on every call (data fault: reward.memory_limit_mb stops it)
    step 13  the newest checkpoint (step 12) is torn, then the trainer's process is SIGKILLed before it trains
    step 14  the rollout worker is SIGKILLed as the sync's logprob probe reaches it (orchestrator/runtime/faults.py fault_hook)
    step 16  the rollout worker is SIGKILLed a third time
    step 19  the rollout worker's node is removed           after its groups were launched

The trainer's restart at step 13 redoes steps 10-13 (from the checkpoint of step 9) and their rows replace the first
attempts', so a process fault there would leave no count in the row: none is scheduled at steps 10-12.

Data faults change what a step trains on (a reward scored 0, an update skipped), so the reference run injects
them too, at the same steps (benchmarks/fault_injection.py, flag files); the process faults are injected in the
fault run only. The report: each fault, what handled it (the row's counters), the time it cost (the wall time
from the first start of its step to the end of that step's last attempt, minus the reference run's time for the
step), samples lost and counted twice (per step: each of the step's groups must hold exactly `rollout.n`
samples, and they must be the reference run's samples, token for token), steps repeated, each step logged once,
and whether the final weights equal the reference run's bit for bit.

    .venv/bin/python benchmarks/faults.py [--out DIR] [--steps 22] [--strategy nccl]

--strategy: weight_sync.strategy of both runs (default object_store); `nccl` is our gloo group on CPU, whose group is
re-formed for every replaced engine (docs/elastic.md).

Takes about 15 minutes on 2 cores. Prints the report and writes it to <out>/faults_report.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

import ray  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from benchmarks.fault_injection import DATA_FAULTS, set_flags  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.controller import GRPOController  # noqa: E402
from orchestrator.runtime.faults import fault_hook  # noqa: E402

SCHEDULE = [(2, "reward_hang"), (3, "rollout_kill"), (5, "nan_loss"), (6, "engine_hang"), (8, "rollout_kill"),
            (10, "reward_memory"), (13, "torn_checkpoint"), (13, "trainer_kill"), (14, "probe_kill"), (16, "rollout_kill"),
            (19, "node_removed")]
PROMPTS, N = 2, 4
FAST_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
# the row counters that show each fault was handled
HANDLED_BY = {"reward_hang": "reward/timeouts", "reward_memory": "reward/memory_errors",
              "nan_loss": "actor/skipped_updates", "rollout_kill": "rollout/worker_restarts",
              "node_removed": "rollout/worker_restarts", "engine_hang": "sync/engine_restarts",
              "probe_kill": "sync/engine_restarts",
              "trainer_kill": "run/restarts", "torn_checkpoint": "run/restarts"}


def overrides(out: Path, steps: int, strategy: str = "object_store") -> list[str]:
    return [f"weight_sync.strategy={strategy}", f"run.output_dir={out}", f"checkpoint.dir={out / 'ckpt'}", "run.progress=false",
            f"trainer.total_steps={steps}", f"rollout.prompts_per_step={PROMPTS}", f"rollout.n={N}",
            "rollout.max_new_tokens=32", "checkpoint.every_steps=3", "checkpoint.every_minutes=0",
            "checkpoint.keep_last=3",  # 1.1 GB each; the torn step 12 falls back to 9
            "reward.functions=[{name: accuracy, weight: 1.0}, "
            "{name: 'benchmarks.fault_injection:flaky_format', weight: 0.5}]",
            "reward.timeout_s=10", "algo.plugins=[benchmarks.fault_loss]", "algo.policy_loss=ppo_clip_nan_on_flag",
            # TIS off: its weight exp(old - rollout) would carry the logprob jitter between fresh vLLM CPU engines
            # (~1e-7, tests/integration/test_exact_resume.py) into the update after each replaced engine
            "algo.tis_cap=null",
            "run.max_restarts=8", "weight_sync.timeout_s=30", "placement.resource=slot",
            "placement.trainer_per_worker=1", "placement.rollout_per_worker=1", "memory.preflight=false"]


class ScheduledFaults(GRPOController):
    """The default controller with SCHEDULE's faults injected (the process faults only when `inject`), and a
    record of every step's attempts, times and samples."""

    def __init__(self, cfg, cluster, inject: bool):
        super().__init__(cfg)
        self.cluster, self.pending = cluster, {(s, f) for s, f in SCHEDULE if inject and f not in DATA_FAULTS}
        self.attempts, self.first_start, self.start, self.end = Counter(), {}, {}, {}
        self.samples: dict[int, list[tuple[int, str]]] = {}  # in the order the trainer gets them
        self.digests: dict[int, str] = {}  # sha256 of the trainer's weights after each step
        self.current, self.kill_in = 0, None  # kill_in: the fault window in which worker 0 is killed next
        self.remove_in = None  # the fault window in which worker 0's node is removed next

    def _take(self, step: int, fault: str) -> bool:
        if (step, fault) not in self.pending:
            return False
        self.pending.discard((step, fault))
        print(f"faults: injecting {fault} at step {step}", flush=True)
        return True

    def step(self, step: int):
        self.current = step
        self.attempts[step] += 1
        self.start[step] = time.monotonic()
        self.first_start.setdefault(step, self.start[step])
        set_flags({f for s, f in SCHEDULE if s == step and f in DATA_FAULTS})  # every attempt of the step
        if self._take(step, "torn_checkpoint"):
            weights = Path(self.last_checkpoint) / "policy" / "model.safetensors"
            with open(weights, "r+b") as f:
                f.truncate(weights.stat().st_size // 2)
        if self._take(step, "rollout_kill"):  # worker 0 dies as this step's generate call reaches it
            self.kill_in = "generate"
        if self._take(step, "node_removed"):  # worker 0's node is removed as this step's generate call reaches it
            self.remove_in = "generate"
        if self._take(step, "probe_kill"):  # the sync at the end of this step: worker 0 dies as the probe reaches it
            self.kill_in = "probe"
        if self._take(step, "engine_hang"):  # the sync at the end of this step hangs on engine 0
            self.job.wait(self.job.actors.rollout[0].extension_call.remote("inject_hang_next_load", 600))
        out = super().step(step)
        self.end[step] = time.monotonic()
        self.digests[step] = self._weights_digest()  # after the timing: not part of the step
        return out

    def fault(self, window: str, k: int, handle) -> None:
        """The fault hook (orchestrator/runtime/faults.py): SIGKILL rollout worker 0 as a call in window `kill_in`
        reaches it, or remove its node as a call in window `remove_in` does."""
        if k == 0 and window == self.kill_in:
            self.kill_in = None
            os.kill(ray.get(handle.pid.remote()), signal.SIGKILL)
        if k == 0 and window == self.remove_in:
            self.remove_in = None
            self.cluster.remove_node(_node_of_rollout(self), allow_graceful=False)

    def _weights_digest(self) -> str:
        named, _ = ray.get(self.actors.trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        h = hashlib.sha256()
        for name, tensor in named:
            h.update(name.encode()), h.update(tensor.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def train(self, trajs, advantages, ref):
        if self._take(self.current, "trainer_kill"):
            os.kill(ray.get(self.actors.trainer.__ray_call__.remote(lambda actor: os.getpid())), signal.SIGKILL)
        self.samples[self.current] = list((t.group_id, hashlib.sha256(json.dumps(
            [t.prompt_ids, t.response_ids]).encode()).hexdigest()[:16]) for t in trajs)
        return super().train(trajs, advantages, ref)


def _node_of_rollout(controller):
    slot = controller.job.actors.plan.slots["rollout"][0]
    table = ray.util.placement_group_table(controller.job.actors.pgs[slot.group])
    node_id = table["bundles_to_node_id"][slot.bundle]
    return next(n for n in controller.cluster.list_all_nodes() if n.node_id == node_id)


def run_once(out: Path, steps: int, inject: bool, strategy: str = "object_store") -> dict:
    """One run on a fresh four-raylet cluster; returns its record."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                             "_system_config": FAST_DEATH})
    for _ in range(3):  # trainer, rollout worker, spare
        cluster.add_node(num_cpus=0, resources={"slot": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    t0 = time.monotonic()
    controller = ScheduledFaults(load_config(str(ROOT / "configs/grpo_arith_cpu.yaml"), overrides(out, steps, strategy)),
                                 cluster, inject)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with fault_hook(controller.fault):
                result = controller.run()
    finally:
        controller.shutdown()
        ray.shutdown()
        cluster.shutdown()
        set_flags(set())
    return {"wall_s": time.monotonic() - t0, "rows": result.rows, "checkpoint": result.checkpoint,
            "base_model": str(controller.model_path),
            "attempts": dict(controller.attempts), "samples": controller.samples, "digests": controller.digests,
            "step_s": {s: controller.end[s] - controller.start[s] for s in controller.end},
            "span_s": {s: controller.end[s] - controller.first_start[s] for s in controller.end},
            "left_pending": sorted(controller.pending), "warnings": [str(w.message) for w in caught]}


def sample_accounting(run: dict, ref: dict, steps: int) -> dict:
    """Samples lost (a slot of a step's groups without its sample), counted twice (more than `rollout.n` in a
    group, or a group not of the step), and steps whose samples differ from the reference run's."""
    lost = twice = 0
    differ, order = [], []
    for step in range(1, steps + 1):
        got = Counter(g for g, _ in run["samples"].get(step, []))
        expected = {step * PROMPTS + i for i in range(PROMPTS)}
        lost += sum(max(0, N - got[g]) for g in expected)
        twice += sum(max(0, c - N) for g, c in got.items() if g in expected)
        twice += sum(c for g, c in got.items() if g not in expected)
        if sorted(run["samples"].get(step, [])) != sorted(ref["samples"].get(step, [])):
            differ.append(step)
        elif run["samples"].get(step) != ref["samples"].get(step):
            order.append(step)
    return {"samples_lost": lost, "samples_counted_twice": twice, "steps_whose_samples_differ": differ,
            "steps_whose_sample_order_differs": order}


def weights_equal(a_ckpt: str, b_ckpt: str, base: str) -> dict:
    """The fault run's final weights against the reference's: tensors bit-equal, the largest difference, and the
    L2 distance between them over the distance the reference trained from the base model."""
    a = load_file(f"{a_ckpt}/policy/model.safetensors")
    b = load_file(f"{b_ckpt}/policy/model.safetensors")
    initial = load_file(f"{base}/model.safetensors")
    same = [k for k in a if k in b and torch.equal(a[k], b[k])]
    diff = max((float((a[k] - b[k]).abs().max()) for k in a if k in b), default=float("nan"))
    shared = [k for k in b if k in a and k in initial]
    moved = float(torch.sqrt(sum(((b[k] - initial[k]) ** 2).sum() for k in shared)))
    apart = float(torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in shared)))
    return {"tensors": len(a), "bitwise_equal_tensors": len(same), "max_abs_diff": diff,
            "l2_apart_over_l2_trained": apart / moved if moved else float("nan"),
            "bit_for_bit": len(same) == len(a) == len(b)}


def report(run: dict, ref: dict, steps: int) -> dict:
    rows = {r["step"]: r for r in run["rows"]}
    clean = [ref["step_s"][s] for s in range(1, steps + 1) if s not in {t for t, _ in SCHEDULE}]
    faults = []
    for step, fault in SCHEDULE:
        counter = HANDLED_BY[fault]
        # a process fault: from the first start of its step to the end of the step's last attempt (a restart
        # and the steps it redid included); a data fault (in both runs): its step's last attempt
        took = run["step_s"][step] if fault in DATA_FAULTS else run["span_s"][step]
        lost = took - ref["step_s"][step]
        faults.append({"step": step, "fault": fault, "handled_by": f"{counter}={rows[step].get(counter)}",
                       "injected_in_reference_too": fault in DATA_FAULTS,
                       "time_lost_s": round(lost, 1), "step_s": round(run["step_s"][step], 1)})
    logged = Counter(r["step"] for r in run["rows"])  # step 0: the eval before training (eval.every_steps)
    finished = all(logged[s] == 1 for s in range(1, steps + 1)) and set(logged) <= set(range(steps + 1)) \
        and logged[0] <= 1
    torn = [w for w in run["warnings"] if "skipping checkpoint" in w]
    for f in faults:  # survived: the run finished, and the fault's own counter (or the skip warning) shows it
        value = rows[f["step"]].get(HANDLED_BY[f["fault"]]) or 0
        f["survived"] = finished and (bool(torn) if f["fault"] == "torn_checkpoint" else value > 0)
    out = {"faults_injected": len(SCHEDULE) - len(run["left_pending"]),
           "faults_survived": sum(f["survived"] for f in faults),
           "faults": faults, "steps_repeated": sum(run["attempts"].values()) - steps,
           "each_step_logged_once": finished,
           "attempts_per_step": {s: a for s, a in sorted(run["attempts"].items()) if a > 1},
           **sample_accounting(run, ref, steps),
           "median_clean_step_s": round(statistics.median(clean), 2),
           "wall_s": {"faults": round(run["wall_s"], 1), "reference": round(ref["wall_s"], 1)},
           "restarts_total": run["rows"][-1].get("faults/restarts_total"),
           "final_weights": weights_equal(run["checkpoint"], ref["checkpoint"], run["base_model"]),
           "reward_mean_equal_per_step": [r.get("reward/mean") for r in run["rows"]] ==
                                         [r.get("reward/mean") for r in ref["rows"]],
           "skipped_checkpoint_warnings": torn,
           "steps_whose_weights_differ": [s for s in range(1, steps + 1)
                                          if run["digests"].get(s) != ref["digests"].get(s)]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output folder (default: a new temporary folder)")
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--strategy", default="object_store", help="weight_sync.strategy of both runs (nccl: gloo on CPU)")
    args = ap.parse_args(argv)
    if args.steps <= max(s for s, _ in SCHEDULE):
        ap.error(f"--steps must exceed the last scheduled fault's step ({max(s for s, _ in SCHEDULE)})")
    out = Path(args.out or tempfile.mkdtemp(prefix="faults_bench_"))
    ref = run_once(out / "reference", args.steps, inject=False, strategy=args.strategy)
    run = run_once(out / "faults", args.steps, inject=True, strategy=args.strategy)
    result = {"strategy": args.strategy, **report(run, ref, args.steps)}
    (out / "faults_report.json").write_text(json.dumps(result, indent=2))
    print(f"{'step':>4} {'fault':<16} {'survived':<8} {'handled by':<28} {'time lost s':>11}")
    for f in result["faults"]:
        print(f"{f['step']:>4} {f['fault']:<16} {str(f['survived']):<8} {f['handled_by']:<28} {f['time_lost_s']:>11}"
              + ("  (also in the reference run)" if f["injected_in_reference_too"] else ""))
    for key in ("strategy", "faults_injected", "faults_survived", "samples_lost", "samples_counted_twice",
                "steps_whose_samples_differ", "steps_whose_sample_order_differs", "steps_whose_weights_differ", "steps_repeated", "attempts_per_step", "each_step_logged_once", "restarts_total",
                "median_clean_step_s", "wall_s", "reward_mean_equal_per_step", "final_weights",
                "skipped_checkpoint_warnings"):
        print(f"{key}: {result[key]}")
    print(f"report: {out / 'faults_report.json'}")
    return 0 if result["final_weights"]["bit_for_bit"] and not result["samples_lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
