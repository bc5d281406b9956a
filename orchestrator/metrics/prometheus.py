"""Prometheus /metrics for a run: each step's metrics row (the JSONL row) mapped onto gauges, counters
and histograms, served by the controller process.

    exporter = PrometheusExporter("127.0.0.1", 9400, run_name="grpo_arith")  # port 0: any free port
    exporter.log_row(row)         # after every step: {"step": 3, "timing/generate_s": 17.9, ...}
    exporter.count_error("sync")  # a step that failed, by kind
    exporter.close()
    # curl http://127.0.0.1:9400/metrics

It is a metric sink (orchestrator/metrics/sink.py): the run builds it from config
(`PrometheusExporter.from_config`: none when `metrics.prometheus_port` is 0); an exception that stops the
run is counted by kind (`on_error` -> `error_kind`) and the server stops (`close`). Every series carries the
label `run`; names are `rl_orch_<component>_<name>_<unit>` (docs/monitoring.md). Row keys that no table below
names are ignored; a key missing from a row leaves its metric as it was. The Grafana dashboard
(deploy/grafana/) and the alerts (deploy/prometheus/) read these names.
"""
from __future__ import annotations

import math
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from orchestrator.metrics.sink import MetricSink, SinkContext
from orchestrator.weight_sync import WeightMismatchError

# 0.01 s .. 1 h: from the fastest phase (advantages, sampling) to a long generation or checkpoint
PHASE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 1800, 3600)

# row key -> gauge name: set to the row's value (NaN included: the raw loss stays visible)
ROW_GAUGES = {
    "step": "rl_orch_trainer_step",
    "rollout/tokens_per_s": "rl_orch_rollout_tokens_per_second",
    "actor/tokens_per_s": "rl_orch_trainer_tokens_per_second",
    "train/tokens_per_s": "rl_orch_trainer_tokens_per_second",
    "rollout/response_len_mean": "rl_orch_rollout_response_length_tokens",
    "rollout/truncated_frac": "rl_orch_rollout_truncated_ratio",
    "rollout/prefix_cache_hit_rate": "rl_orch_rollout_prefix_cache_hit_ratio",
    "rollout/staleness": "rl_orch_rollout_staleness_steps",
    "rollout/queue_depth": "rl_orch_rollout_queue_depth",
    "rollout/mismatch_kl_k3": "rl_orch_rollout_mismatch_kl",  # rollout engine vs trainer (orchestrator/algo/mismatch_metrics.py)
    "rollout/mismatch_ratio_max": "rl_orch_rollout_mismatch_ratio_max",
    "rollout/mismatch_masked_token_frac": "rl_orch_rollout_mismatch_masked_ratio",
    "reward/mean": "rl_orch_reward_mean",
    "reward/std": "rl_orch_reward_std",
    "reward/accuracy_mean": "rl_orch_reward_accuracy_mean",
    "actor/kl": "rl_orch_actor_kl",
    "actor/rollout_kl_k1": "rl_orch_actor_rollout_kl",
    "actor/clip_frac": "rl_orch_actor_clipped_ratio",
    "actor/entropy": "rl_orch_actor_entropy_nats",
    "actor/approx_kl_old": "rl_orch_actor_approx_kl_old",
    "actor/loss": "rl_orch_actor_loss",
    "actor/grad_norm": "rl_orch_actor_grad_norm",
    "actor/update_ratio": "rl_orch_actor_update_ratio",
    "actor/lr": "rl_orch_actor_learning_rate",
    "actor/skipped_in_a_row": "rl_orch_actor_skipped_updates_in_a_row",
    "timing/weight_sync_s": "rl_orch_sync_seconds",
    "sync/seconds": "rl_orch_sync_seconds",  # after timing/weight_sync_s: the sync's own timer wins
    "sync/bytes": "rl_orch_sync_bytes",
    "sync/version": "rl_orch_sync_weight_version",
    "sync/probe_max_abs_diff": "rl_orch_sync_probe_max_abs_diff_nats",
    "sync/probe_full_kl": "rl_orch_sync_probe_full_kl_nats",
    "run/restarts": "rl_orch_run_restarts",
}

# row key -> (counter name, fixed labels): incremented by the row's value (a count for this step)
ROW_COUNTERS = {
    "rollout/tokens": ("rl_orch_rollout_tokens_total", {}),
    "rollout/prefill_tokens_requested": ("rl_orch_rollout_prefill_tokens_total", {"kind": "requested"}),
    "rollout/prefill_tokens_computed": ("rl_orch_rollout_prefill_tokens_total", {"kind": "computed"}),
    "reward/errors": ("rl_orch_errors_total", {"kind": "reward"}),
    "reward/timeouts": ("rl_orch_errors_total", {"kind": "reward_timeout"}),
    "reward/memory_errors": ("rl_orch_errors_total", {"kind": "reward_memory"}),
    "sync/failures": ("rl_orch_sync_failures_total", {}),
    "actor/skipped_updates": ("rl_orch_actor_skipped_updates_total", {}),
    "rollout/worker_restarts": ("rl_orch_restarts_total", {"kind": "rollout_generate"}),
    "sync/engine_restarts": ("rl_orch_restarts_total", {"kind": "rollout_sync"}),
    "rollout/groups_reissued": ("rl_orch_rollout_groups_reissued_total", {}),
    "elastic/added": ("rl_orch_elastic_decisions_total", {"action": "add"}),
    "elastic/retired": ("rl_orch_elastic_decisions_total", {"action": "retire"}),
    "elastic/add_failed": ("rl_orch_elastic_decisions_total", {"action": "add_failed"}),
    "elastic/drained": ("rl_orch_elastic_decisions_total", {"action": "drain"}),
}

# metric name -> (type, help, labels besides `run`)
METRICS = {
    "rl_orch_trainer_step": ("gauge", "Last finished step", ()),
    "rl_orch_trainer_steps_total": ("counter", "Steps finished by this process", ()),
    "rl_orch_trainer_last_step_timestamp_seconds": ("gauge", "Unix time the last step finished", ()),
    "rl_orch_trainer_step_seconds": ("histogram", "Wall seconds of a whole step", ()),
    "rl_orch_phase_seconds": ("histogram", "Wall seconds of one phase of a step (timing/<phase>_s)", ("phase",)),
    "rl_orch_rollout_tokens_per_second": ("gauge", "Generated tokens per second, all rollout workers", ()),
    "rl_orch_trainer_tokens_per_second": ("gauge", "Trained tokens per second", ()),
    "rl_orch_rollout_tokens_total": ("counter", "Generated tokens", ()),
    "rl_orch_role_busy_seconds": ("gauge", "Seconds of the last step a role was working", ("role",)),
    "rl_orch_role_idle_ratio": ("gauge", "Fraction of the last step a role waited (pipeline bubble)", ("role",)),
    "rl_orch_rollout_prefill_tokens_total": ("counter", "Prompt tokens sent to vLLM (requested) and prefilled "
                                             "(computed: not found in the prefix cache)", ("kind",)),
    "rl_orch_rollout_response_length_tokens": ("gauge", "Mean response length of the step, tokens", ()),
    "rl_orch_rollout_truncated_ratio": ("gauge", "Fraction of responses cut at max_tokens", ()),
    "rl_orch_rollout_prefix_cache_hit_ratio": ("gauge", "vLLM prefix-cache hit rate of the step", ()),
    "rl_orch_rollout_staleness_steps": ("gauge", "Policy versions between rollout and update", ()),
    "rl_orch_rollout_queue_depth": ("gauge", "Rollout batches waiting for the trainer", ()),
    "rl_orch_rollout_mismatch_kl": ("gauge", "KL(rollout engine || trainer) over the step's tokens (k3)", ()),
    "rl_orch_rollout_mismatch_ratio_max": ("gauge", "Largest trainer/engine probability ratio of a sampled token", ()),
    "rl_orch_rollout_mismatch_masked_ratio": ("gauge", "Fraction of response tokens the rollout correction masked", ()),
    "rl_orch_reward_mean": ("gauge", "Mean reward of the step", ()),
    "rl_orch_reward_std": ("gauge", "Standard deviation of the step's rewards", ()),
    "rl_orch_reward_accuracy_mean": ("gauge", "Mean accuracy reward of the step", ()),
    "rl_orch_actor_kl": ("gauge", "KL between policy and reference", ()),
    "rl_orch_actor_rollout_kl": ("gauge", "KL between rollout engine and trainer logprobs (k1)", ()),
    "rl_orch_actor_clipped_ratio": ("gauge", "Fraction of tokens whose ratio was clipped", ()),
    "rl_orch_actor_entropy_nats": ("gauge", "Token entropy of the policy over response tokens (nats)", ()),
    "rl_orch_actor_approx_kl_old": ("gauge", "Approximate KL (k3) between the old policy and the updated one", ()),
    "rl_orch_actor_loss": ("gauge", "Policy loss of the step (NaN when it was NaN)", ()),
    "rl_orch_actor_loss_nan": ("gauge", "1 when the step's loss was NaN or infinite, else 0", ()),
    "rl_orch_actor_grad_norm": ("gauge", "Gradient norm before clipping", ()),
    "rl_orch_actor_update_ratio": ("gauge", "Size of the step's optimizer updates relative to the weights before them, "
                                   "||delta theta|| / ||theta_old|| (guards.update_ratio_max)", ()),
    "rl_orch_actor_learning_rate": ("gauge", "Learning rate of the step", ()),
    "rl_orch_actor_skipped_updates_total": ("counter", "Optimizer updates skipped: non-finite loss, gradient norm "
                                            "or updated weights (weights and optimizer state unchanged)", ()),
    "rl_orch_actor_skipped_updates_in_a_row": ("gauge", "Updates skipped in a row (run.max_skipped_updates stops "
                                               "the run)", ()),
    "rl_orch_guard_tripped": ("gauge", "1 while an optional guard (guards.*) is tripped, else 0", ("guard",)),
    "rl_orch_sync_seconds": ("gauge", "Wall seconds of the last weight sync", ()),
    "rl_orch_sync_bytes": ("gauge", "Bytes sent by the last weight sync", ()),
    "rl_orch_sync_weight_version": ("gauge", "Weight version the engines hold", ()),
    "rl_orch_sync_probe_max_abs_diff_nats": ("gauge", "Largest engine-trainer logprob difference of the last "
                                             "weight-sync probe (weight_sync.probe)", ()),
    "rl_orch_sync_probe_full_kl_nats": ("gauge", "Largest KL of the engine's and the trainer's next-token "
                                        "distributions on the last weight-sync probe (weight_sync.probe_top_k)", ()),
    "rl_orch_sync_failures_total": ("counter", "Weight syncs that failed (version, checksum or probe mismatch)", ()),
    "rl_orch_errors_total": ("counter", "Errors by kind: reward, reward_timeout, reward_memory, sync, timeout, step", ("kind",)),
    "rl_orch_restarts_total": ("counter", "Actors replaced after a failure (run.max_restarts), by kind: "
                               "rollout_generate (lost while generating), rollout_sync (lost or hung in a weight sync)",
                               ("kind",)),
    "rl_orch_rollout_groups_reissued_total": ("counter", "Rollout groups issued again after their worker was lost", ()),
    "rl_orch_rollout_engines": ("gauge", "Rollout engines by state (engines/<state> row keys): active = the engine "
                                "count at the end of the last step", ("state",)),
    "rl_orch_elastic_decisions_total": ("counter", "placement.elastic changes of the engine count, by action: add, "
                                        "retire, add_failed (the new engine's placement group could not be placed)",
                                        ("action",)),
    "rl_orch_run_restarts": ("gauge", "Restarts of the job from its checkpoint so far (run.max_restarts)", ()),
    "rl_orch_memory_bytes": ("gauge", "memory/<name>_{bytes,mib,mb,gib,gb} row keys, in bytes", ("name",)),
    "rl_orch_memory_value": ("gauge", "memory/<name> row keys without a byte unit, as logged", ("name",)),
    "rl_orch_critic_value": ("gauge", "PPO's critic (algo.estimator=gae), critic/<name> row keys: value_loss, "
                             "vf_clip_frac, explained_var, values_mean, returns_mean, grad_norm, lr, ...", ("name",)),
    "rl_orch_eval_value": ("gauge", "Held-out eval metrics eval/<name> (pass_at_1, maj_at_k, ...) of the last eval",
                           ("name",)),
}

ERROR_KINDS = ("reward", "reward_timeout", "reward_memory", "sync", "timeout", "step")  # created at 0 so increase() sees the first
BYTE_UNITS = {"_bytes": 1, "_mib": 2**20, "_mb": 2**20, "_gib": 2**30, "_gb": 2**30}  # MB/GB read as MiB/GiB


def error_kind(exc: BaseException) -> str:
    """The `kind` label of a failed step: "sync" (weight mismatch), "timeout" (an actor call), else "step"."""
    if isinstance(exc, WeightMismatchError):
        return "sync"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "step"


def _number(value) -> Optional[float]:
    """The row value as a float; None for what is not a number (None, strings, bools, lists)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _make(kind: str, name: str, doc: str, labels: tuple, registry: CollectorRegistry):
    if kind == "gauge":
        return Gauge(name, doc, ("run",) + labels, registry=registry)
    if kind == "counter":
        return Counter(name, doc, ("run",) + labels, registry=registry)
    buckets = PHASE_BUCKETS_S + (float("inf"),)
    return Histogram(name, doc, ("run",) + labels, registry=registry, buckets=buckets)


class PrometheusExporter(MetricSink):
    """Serves `/metrics` from its own registry on `host:port` (port 0: a free one, see `.port`); a metric sink
    (orchestrator/metrics/sink.py): each step's row is mapped onto the metrics, a failure that stops the run
    counts in `rl_orch_errors_total{kind}`, `close` stops serving."""

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> Optional["PrometheusExporter"]:
        """A serving exporter when `metrics.prometheus_port > 0` (its URL printed once), else None."""
        m = cfg.metrics
        if m.prometheus_port <= 0:
            return None
        exporter = cls(m.prometheus_host, m.prometheus_port, ctx.run_name)
        print(f"prometheus metrics: {exporter.url}", flush=True)
        return exporter

    def __init__(self, host: str, port: int, run_name: str):
        self.run_name = run_name
        self.registry = CollectorRegistry()
        self.metrics = {name: _make(kind, name, doc, labels, self.registry)
                        for name, (kind, doc, labels) in METRICS.items()}
        self._init_series()
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise OSError(f"metrics.prometheus_port={port}: cannot serve /metrics on {host}:{port}: {e}") from None
        self.host, self.port = host, self._server.server_port
        self.url = f"http://{host}:{self.port}/metrics"

    def _series(self, metric: str, **labels):
        return self.metrics[metric].labels(run=self.run_name, **labels)

    def _init_series(self) -> None:
        """Counters and the NaN flag exist at 0 from the start, so that the first increase is visible."""
        for metric in ("rl_orch_trainer_steps_total", "rl_orch_rollout_tokens_total", "rl_orch_sync_failures_total",
                       "rl_orch_actor_skipped_updates_total"):
            self._series(metric)
        for kind in ERROR_KINDS:
            self._series("rl_orch_errors_total", kind=kind)
        self._series("rl_orch_actor_loss_nan").set(0)

    # ---- one step ---------------------------------------------------------------------------------
    def log_row(self, row: dict) -> None:
        """Map one step's metrics row onto the metrics. Raises ValueError, naming the key and before any
        metric changes, for a `step` that is not a whole number >= 0, a count that is negative or not
        finite (e.g. `reward/errors: -1`), or a phase time that is negative or not finite."""
        _check_row(row)
        for key, value in row.items():
            self._observe_key(key, value)
        if "step" in row:
            self._series("rl_orch_trainer_steps_total").inc()
            self._series("rl_orch_trainer_last_step_timestamp_seconds").set_to_current_time()
        if "actor/loss" in row:  # None: the JSONL log's spelling of NaN / inf
            loss = _number(row["actor/loss"])
            self._series("rl_orch_actor_loss_nan").set(0 if loss is not None and math.isfinite(loss) else 1)

    def _observe_key(self, key: str, value) -> None:
        x = _number(value)
        if x is None:
            return
        if key in ROW_GAUGES:  # a key may feed a gauge and a histogram (timing/weight_sync_s)
            self._series(ROW_GAUGES[key]).set(x)
        if key in ROW_COUNTERS:
            self._count(key, x)
        if key.startswith("timing/") and key.endswith("_s"):
            self._observe_phase(key[len("timing/"):-len("_s")], x)
        elif key.startswith("memory/"):
            self._observe_memory(key[len("memory/"):], x)
        elif key.startswith("roles/"):
            self._observe_role(key[len("roles/"):], x)
        elif key.startswith("eval/"):  # held-out eval (orchestrator/eval): eval/pass_at_1 -> name="pass_at_1"
            self._series("rl_orch_eval_value", name=key[len("eval/"):]).set(x)
        elif key.startswith("critic/"):  # PPO's value model (algo.estimator=gae): critic/value_loss -> name="value_loss"
            self._series("rl_orch_critic_value", name=key[len("critic/"):]).set(x)
        elif key.startswith("engines/"):  # engines/active -> rl_orch_rollout_engines{state="active"}
            self._series("rl_orch_rollout_engines", state=key[len("engines/"):]).set(x)
        elif key.startswith("guard/"):  # orchestrator/guards/signals.py: 0/1 per enabled guard
            self._series("rl_orch_guard_tripped", guard=key[len("guard/"):]).set(x)

    def _count(self, key: str, x: float) -> None:
        metric, labels = ROW_COUNTERS[key]
        if x > 0:
            self._series(metric, **labels).inc(x)

    def _observe_phase(self, phase: str, seconds: float) -> None:
        if phase == "step":
            self._series("rl_orch_trainer_step_seconds").observe(seconds)
        else:
            self._series("rl_orch_phase_seconds", phase=phase).observe(seconds)

    def _observe_role(self, name: str, x: float) -> None:
        for suffix, metric in (("_busy_s", "rl_orch_role_busy_seconds"), ("_idle_frac", "rl_orch_role_idle_ratio")):
            if name.endswith(suffix):
                self._series(metric, role=name[: -len(suffix)]).set(x)

    def _observe_memory(self, name: str, x: float) -> None:
        for suffix, scale in BYTE_UNITS.items():
            if name.endswith(suffix):
                self._series("rl_orch_memory_bytes", name=name[: -len(suffix)]).set(x * scale)
                return
        self._series("rl_orch_memory_value", name=name).set(x)

    # ---- failures and shutdown --------------------------------------------------------------------
    def count_error(self, kind: str) -> None:
        """One error of `kind` (`rl_orch_errors_total{kind=...}`); kind "sync" also counts a failed sync."""
        self._series("rl_orch_errors_total", kind=kind).inc()
        if kind == "sync":
            self._series("rl_orch_sync_failures_total").inc()

    def on_error(self, exc: BaseException) -> None:
        """The run stops with `exc`: one error of its kind (`error_kind`)."""
        self.count_error(error_kind(exc))

    def close(self) -> None:
        """Stop serving (idempotent); the registry stays readable."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None


def _check_row(row: dict) -> None:
    """Reject a row that would corrupt a counter or a histogram (nothing is applied then)."""
    if not isinstance(row, dict):
        raise ValueError(f"a metrics row must be a dict, got {type(row).__name__}")
    step = row.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"metrics row key 'step': must be a whole number >= 0, got {step!r}")
    for key, value in row.items():
        timed = key.startswith("timing/") and key.endswith("_s")
        if key in ROW_COUNTERS or timed:
            x = _number(value)
            if value is not None and x is None:
                raise ValueError(f"metrics row key {key!r}: must be a number, got {value!r}")
            if x is not None and (not math.isfinite(x) or x < 0):
                what = "a count" if key in ROW_COUNTERS else "a phase time"
                raise ValueError(f"metrics row key {key!r}: {what} must be a finite number >= 0, got {x!r}")
