"""Controller side of weight sync: one generic syncer drives every strategy's sender (on the trainer)
and receivers (in every rollout engine), then verifies what each engine holds.

    syncer = make_syncer(cfg, trainer, engines)   # weight_sync.strategy: a registered name (registry.py)
    metrics = syncer.sync(version)                # raises WeightMismatchError / TimeoutError, never hangs

The strategies live in actors/weight_sync/<strategy>.py (sender, receiver and the small controller-side hooks of
`WeightSyncStrategy`); this file holds what they share. Verification (every strategy): each engine reports its weight
version and per-group checksums; a wrong version or a differing group raises `WeightMismatchError` naming the engine
and the tensor group (redone up to weight_sync.retries times). Non-finite checksums of the trainer's own weights raise
`NonFiniteWeightsError` at once (no retry can fix them). Then (weight_sync.probe, every weight_sync.probe_every syncs)
each engine scores a fixed token sequence whose logprobs must match the trainer's within weight_sync.probe_tolerance
(orchestrator/weight_sync/probe.py): what the engine computes with, which a backend that repacks weights into its own
kernels can make differ from what it loaded. Every call waits at most `weight_sync.timeout_s`.

Overlapped syncs (`start` / `ready` / `finish_each`, driven by orchestrator/weight_sync/overlapped.py for streaming
runs): `start` returns once the trainer has sent `version`; the engines generate on their verified weights during
the send, then every engine's stream is held (it generates nothing more), then loads and, when due, scores the probe,
in that order on the engine, while the trainer goes on (its own probe logprobs are computed right after its send,
before any later call on it). `finish_each` verifies
each engine on its own and releases the ones verified; a failed or lost one stays held, its verified version
forgotten, so the next sync sends it full weights and probes it. Not for a concurrent strategy.

Engines come and go (docs/faults.md, docs/elastic.md): an engine whose load dies or does not answer within
`weight_sync.timeout_s` raises `EnginesLost` naming it (the job replaces it and syncs again);
`replace_engine(k, handle, version)` connects a fresh engine k and brings it to `version`; `add_engine` and
`remove_engine` grow and shrink the set. A concurrent strategy (a collective group: nccl, gloo, vllm_nccl) re-forms
its group for every change of membership (`reform`: a new group, the old one destroyed on the trainer and on every
engine), and a member lost on the wire fails the broadcast for all: `EnginesLost` names the lost one, the job
replaces it, the group is re-formed and the sync redone on every engine. An engine that leaves from the middle hands
its index to the last engine.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import ray

from actors.weight_sync.base import SyncContext, WeightSender
from orchestrator.runtime.faults import EnginesLost, call_engine, gather_engines
from orchestrator.weight_sync import WeightMismatchError, check_finite_checksums, compare_checksums
from orchestrator.weight_sync.fp8_check import check_fp8_report
from orchestrator.weight_sync.probe import ProbeMismatchError, probe_due, probe_nll
from orchestrator.weight_sync.probe_judge import ProbeJudge
from orchestrator.weight_sync.registry import get

log = logging.getLogger(__name__)


@dataclass
class PendingSync:
    """A sync `WeightSyncer.start` started and `finish_each` has not verified: the refs of every engine's load
    (its checksum report) and, when the probe is due, of the trainer's and every engine's probe logprobs.
    `send_s`: seconds `start` blocked (the trainer's send); `t0`: its perf_counter at the start."""

    version: int
    t0: float
    send_s: float
    meta: dict
    loads: dict[int, Any]
    trainer_probe: Any = None
    probes: dict[int, Any] = field(default_factory=dict)

    def refs(self) -> list:
        return [*self.loads.values(), *self.probes.values(), *([self.trainer_probe] if self.trainer_probe else [])]


class WeightSyncer:
    """Setup, transfer, verification, retries, timeouts and `sync/*` metrics of one strategy.

    `strategy`: a registered name (default `weight_sync.strategy`; `auto` resolved first). `setup()` (`make_syncer`
    calls it) makes the trainer's sender and connects every engine's receiver. `engine_versions[i]`: the version last
    verified on engine i (None before its first sync).
    """

    def __init__(self, cfg, trainer, engines: list, strategy: Optional[str] = None):
        self.cfg, self.ws = cfg, cfg.weight_sync
        self.trainer, self.engines = trainer, list(engines)
        self.dtype = cfg.rollout.dtype
        self.engine_versions: list[Optional[int]] = [None] * len(self.engines)
        self.name = strategy or self.ws.strategy
        if self.name == "auto":
            raise ValueError("weight_sync.strategy=auto: resolve it first (choose_for_config)")
        self.entry = get(self.name)
        self.info: dict = {}
        self.probe_ids: Optional[tuple[list[int], list[int]]] = None  # (prompt, continuation), made at setup
        self.judge = ProbeJudge(cfg)  # its start_nll: the trainer's probe NLL at setup (the weights the run starts from)
        self.syncing = 0  # the version of the sync in progress (the last one started)
        self.syncs = 0  # syncs that passed verification (weight_sync.probe_every counts them)
        self.cleanup_due: Optional[int] = None  # an overlapped sync's version whose `after_verified` is still due
        self.reforms = 0  # times the strategy was connected for a new set of engines (`reform`; setup is the first)

    def _get(self, refs, what: str):
        try:
            return ray.get(refs, timeout=self.ws.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"weight sync ({self.name}): {what} did not finish within "
                               f"weight_sync.timeout_s={self.ws.timeout_s:g}s") from None

    def setup(self) -> None:
        """One-time preparation before the first sync: the sender and every receiver connect (`reform`), then the
        probe's tokens and the trainer's probe of its starting weights (weight_sync.probe)."""
        self.strategy = self.entry.load()
        self.reform()
        if self.ws.probe and self.engines:
            self.probe_ids = tuple(self._get(call_engine(self.engines, 0, "probe", "probe_tokens"), "the probe's tokens"))
            self.judge.start_nll = probe_nll(self._get(self.trainer.probe_logprobs.remote(*self.probe_ids),
                                                 "the trainer's probe of its starting weights").logprobs)

    def reform(self) -> None:
        """Connect the strategy for the current engines: the trainer makes a fresh sender (`setup`: a collective
        strategy picks a new group name for the new membership and destroys its side of the old group), then the
        sender and every engine's receiver `connect` at the same time (a collective group forms there; an engine's
        previous receiver of the strategy is closed first). Every engine's verified version is kept: reforming
        moves no weights."""
        tp = int(getattr(self.cfg.rollout, "tensor_parallel_size", 1) or 1)
        ctx = SyncContext(engines=len(self.engines), tensor_parallel_size=tp, timeout_s=self.ws.timeout_s,
                          dtype=self.dtype, options=self.strategy.options(self.ws))
        if self.strategy.concurrent:  # a dead member would hold the new group (the trainer too) until its timeout:
            # found first, EnginesLost names it (the job replaces it, then re-forms again)
            gather_engines({k: call_engine(self.engines, k, "connect", "ready") for k in range(len(self.engines))},
                           self.ws.timeout_s, "liveness check")
        self.info = self._get(self.trainer.weight_sync.remote(self.entry, "setup", ctx), "the sender's setup")
        trainer = self.trainer.weight_sync.remote(self.entry, "connect", self.info)
        engines = {k: call_engine(self.engines, k, "connect", "weight_sync", self.entry, "connect", self.info, k)
                   for k in range(len(self.engines))}
        gather_engines(engines, self.ws.timeout_s, "connect", hold_errors=True)
        self._get(trainer, "connecting the trainer")
        self.reforms += 1

    def replace_engine(self, k: int, handle, version: Optional[int]) -> dict:
        """Engine k is a fresh actor `handle` (it holds the weights it started from): connect its receiver (a
        concurrent strategy: `reform` the group with every engine), then, unless `version` is None (no sync yet: it
        holds what the others hold), sync and verify it on `version` (a concurrent strategy: every engine, the
        broadcast reaches the whole group). Returns the sync's `sync/*` metrics ({} without a sync)."""
        self.engines[k], self.engine_versions[k] = handle, None
        if self.strategy.concurrent:
            self.reform()
        else:
            self._connect_one(k)
        if version is None:
            return {}
        return self.sync(version, None if self.strategy.concurrent else [k])

    def add_engine(self, handle, version: Optional[int]) -> dict:
        """A new engine (index len(engines)) joins: connected and synced on `version` as `replace_engine` does.
        Returns the sync's `sync/*` metrics."""
        self.engines.append(handle)
        self.engine_versions.append(None)
        return self.replace_engine(len(self.engines) - 1, handle, version)

    def remove_engine(self, k: int) -> None:
        """Engine k leaves; the last engine takes its index (the others keep theirs). A concurrent strategy re-forms
        its group without it; otherwise the moved engine connects again at its new index (a fresh receiver: its
        version is forgotten, so the next sync brings it the full weights, verified and probed). Raises ValueError
        for the only engine or an index out of range."""
        n = len(self.engines)
        if n < 2 or not 0 <= k < n:
            raise ValueError(f"remove_engine({k}): {n} engines; one of 0..{n - 1} may leave, never the only one")
        moved = k != n - 1
        if moved:
            self.engines[k], self.engine_versions[k] = self.engines[-1], None
        self.engines.pop()
        self.engine_versions.pop()
        if self.strategy.concurrent:
            self.reform()
        elif moved:  # a dead moved engine: EnginesLost naming it (the job replaces it)
            gather_engines({k: self._connect_one(k, wait=False)}, self.ws.timeout_s, "connect")

    def _connect_one(self, k: int, wait: bool = True):
        ref = call_engine(self.engines, k, "connect", "weight_sync", self.entry, "connect", self.info, k)
        return self._get(ref, f"connecting rollout worker {k}") if wait else ref

    def sync(self, version: int, engine_ids: Optional[list[int]] = None) -> dict:
        """Bring engines `engine_ids` (default: all) to `version`, verified, then probed when due (the first
        sync of an engine, and every weight_sync.probe_every-th sync); returns `sync/*` metrics (`sync/seconds`
        without the probe, which reports `sync/probe_s` and `sync/probe_max_abs_diff` when it ran)."""
        ids = list(range(len(self.engines))) if engine_ids is None else list(engine_ids)
        t0, self.syncing = time.perf_counter(), version
        fresh = any(self.engine_versions[i] is None for i in ids)  # a new, restarted or failed engine: probe it
        meta, reports = self._transfer(version, ids)
        check_finite_checksums(meta.get("groups", {}))  # the trainer's own NaN: NonFiniteWeightsError, never retried
        self.strategy.check_reports(version, reports)
        self._verify(version, meta, reports)
        due = fresh or probe_due(self.syncs, self.ws.probe_every)
        probed = self.probe(ids) if self.probe_ids is not None and due else {}
        self.syncs += 1
        self._after_verified(version)
        seconds = time.perf_counter() - t0 - probed.get("sync/probe_s", 0.0)  # the transfer + checks; probe apart
        metrics = {**self.strategy.metrics(meta, reports), **probed}
        moved = metrics.get("sync/bytes", meta["bytes"])
        metrics.update({"sync/seconds": seconds, "sync/version": version, "sync/bytes_full": meta["bytes"],
                        "sync/bytes": moved, "sync/gbps": moved * len(ids) / max(seconds, 1e-9) / 1e9})
        return metrics

    def probe(self, engine_ids: Optional[list[int]] = None) -> dict:
        """Score the probe sequence on engines `engine_ids` (default: all) and on the trainer, compare within
        weight_sync.probe_tolerance (0: the engine dtype's default) and their next-token distributions within
        weight_sync.probe_kl_tolerance. Returns {"sync/probe_max_abs_diff": the largest difference in nats over the
        engines, "sync/probe_full_kl": the largest KL (with weight_sync.probe_top_k > 0), "sync/probe_s": seconds,
        "sync/probe_nll"}. Raises ProbeMismatchError
        (a WeightMismatchError) naming the first engine outside the tolerance, whose verified version is
        forgotten (the redo sends it full weights); EnginesLost naming the engines that died or did not answer
        within weight_sync.timeout_s; RuntimeError before setup made the probe's tokens."""
        if self.probe_ids is None:
            raise RuntimeError("weight-sync probe: no probe tokens (weight_sync.probe=false, or setup not run)")
        ids = list(range(len(self.engines))) if engine_ids is None else list(engine_ids)
        t0 = time.perf_counter()
        trainer_ref = self._trainer_probe()
        # a lost engine: EnginesLost (replaced, redone)
        got = gather_engines(self._engine_probes(ids), self.ws.timeout_s, "logprob probe")
        want = self._get(trainer_ref, "the trainer's logprob probe")
        note, worst = self.judge.divergence(want.logprobs, self.syncing), {"sync/probe_max_abs_diff": 0.0}
        for i, scores in got.items():
            try:
                self.judge.compare(i, scores, want, note, worst)
            except ProbeMismatchError:
                self.engine_versions[i] = None
                raise
        return {**worst, "sync/probe_s": time.perf_counter() - t0, "sync/probe_nll": probe_nll(want.logprobs)}

    def _trainer_probe(self):
        """The trainer's probe ref: its `ProbeScores`, with its log-softmax rows when weight_sync.probe_top_k > 0."""
        return self.trainer.probe_logprobs.remote(*self.probe_ids, self.ws.probe_top_k > 0)

    def _engine_probes(self, ids: list[int]) -> dict[int, Any]:
        """{engine: ref of its `ProbeScores`} of engines `ids`, with their top weight_sync.probe_top_k tokens."""
        return {i: call_engine(self.engines, i, "probe", "probe_logprobs", *self.probe_ids, self.ws.probe_top_k)
                for i in ids}

    def sync_with_retries(self, version: int, retries: int) -> dict:
        """`sync(version)`, redone up to `retries` times (weight_sync.retries) when verification fails: a
        corrupted or stale engine (WeightMismatchError). Returns the metrics of the attempt that passed, with
        `sync/failures` = the failed attempts before it (Prometheus rl_orch_sync_failures_total). Raises the
        last WeightMismatchError when every attempt failed; TimeoutError and other errors at once (a hung
        transport is not retried)."""
        for attempt in range(retries + 1):
            try:
                metrics = self.sync(version)
            except WeightMismatchError as e:
                if attempt == retries:
                    raise
                log.warning("weight sync to version %d failed verification (%s); redoing it (%d of %d)",
                            version, e, attempt + 1, retries)
                continue
            metrics["sync/failures"] = attempt
            return metrics
        raise AssertionError("unreachable")

    # ---- overlapped syncs (orchestrator/weight_sync/overlapped.py) ----------------------------------------
    def start(self, version: int) -> PendingSync:
        """Start syncing every engine to `version`; return once the trainer has sent it (module docstring).
        Raises ValueError for a concurrent strategy, NonFiniteWeightsError for the trainer's own non-finite
        weights (before any engine loads), TimeoutError past weight_sync.timeout_s for the send."""
        if self.strategy.concurrent:
            raise ValueError(f"weight_sync.strategy={self.name} is a concurrent (collective) strategy: its syncs "
                             "cannot overlap the next step (the trainer is on the wire); use weight_sync.overlap=false")
        t0 = time.perf_counter()
        if self.cleanup_due is not None:  # the last overlapped sync's clean-up: the trainer is free now
            self._after_verified(self.cleanup_due)
            self.cleanup_due = None
        ids, versions = list(range(len(self.engines))), dict(enumerate(self.engine_versions))
        due = self.probe_ids is not None and (None in versions.values() or probe_due(self.syncs, self.ws.probe_every))
        payload, meta_ref = self.trainer.weight_sync.options(num_returns=2).remote(self.entry, "send", version, versions)
        trainer_probe = self._trainer_probe() if due else None
        meta = self._get(meta_ref, "the trainer's send")
        check_finite_checksums(meta.get("groups", {}))
        # each engine's stream held after the send (it sampled on its verified weights meanwhile) and before its
        # load, in that order on the engine: nothing is sampled on unverified weights
        for i in ids:
            call_engine(self.engines, i, "load", "stream_hold")
        loads = {i: call_engine(self.engines, i, "load", "weight_sync", self.entry, "load", payload, version)
                 for i in ids}
        probes = self._engine_probes(ids) if due else {}
        return PendingSync(version, t0, time.perf_counter() - t0, meta, loads, trainer_probe, probes)

    def ready(self, pending: PendingSync) -> bool:
        """Whether every call of `pending` has returned (does not wait)."""
        refs = pending.refs()
        return len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == len(refs)

    def finish_each(self, pending: PendingSync) -> tuple[dict, dict[int, str], dict[int, str]]:
        """Verify every engine of `pending` on its own (waiting up to weight_sync.timeout_s) and release the
        verified ones. Returns (`sync/*` metrics, {engine: why its verification failed}, {engine: why it is lost});
        a failed or lost engine stays held with its verified version forgotten. Raises TimeoutError when the
        trainer's probe does not return."""
        v, lost, failed = pending.version, {}, {}
        self.syncing = v
        reports = self._collect(pending.loads, lost)
        want = self._get(pending.trainer_probe, "the trainer's probe") if pending.trainer_probe else None
        probes = self._collect({i: pending.probes[i] for i in reports}, lost) if want is not None else {}
        note = self.judge.divergence(want.logprobs, self.syncing) if want is not None else None
        worst = {"sync/probe_max_abs_diff": 0.0}
        for i, rep in reports.items():
            try:
                self.strategy.check_reports(v, {i: rep})
                self._verify(v, pending.meta, {i: rep})
                if i in probes:
                    self.judge.compare(i, probes[i], want, note, worst)
                elif want is not None:
                    continue  # lost during its probe
            except WeightMismatchError as e:
                failed[i] = str(e)
                continue
            call_engine(self.engines, i, "load", "stream_release")
        for i in (*failed, *lost):
            self.engine_versions[i] = None
        if not failed and not lost:
            self.syncs += 1
            self.cleanup_due = v
        metrics = {**self.strategy.metrics(pending.meta, reports), "sync/version": v, "sync/overlapped": 1.0,
                   "sync/seconds": time.perf_counter() - pending.t0, "sync/blocking_s": pending.send_s,
                   "sync/bytes_full": pending.meta["bytes"]}
        metrics.setdefault("sync/bytes", pending.meta["bytes"])
        if want is not None:
            metrics.update(worst)
        return metrics, failed, lost

    def _collect(self, refs: dict, lost: dict[int, str]) -> dict[int, Any]:
        """{engine: result} of the engines' calls `refs` that returned; the others (died, or no answer within
        weight_sync.timeout_s) into `lost` with the reason. Errors other than a lost actor are raised."""
        try:
            return self._loads(refs)
        except EnginesLost as e:
            lost.update(e.reasons)
        out = {}
        for i, ref in refs.items():
            if i not in lost:
                out[i] = ray.get(ref)
        return out

    def _transfer(self, version: int, ids: list[int]) -> tuple[dict, dict[int, dict]]:
        """The sender's send, then every engine's load (or both at once for a concurrent strategy);
        returns (the sender's meta, {engine index: its checksum report})."""
        if self.strategy.concurrent and len(ids) != len(self.engines):
            raise ValueError(f"a {self.name} sync reaches every engine of the group; engine_ids must be all engines")
        versions = {i: self.engine_versions[i] for i in ids}
        payload, meta_ref = self.trainer.weight_sync.options(num_returns=2).remote(self.entry, "send", version,
                                                                                     versions)
        if self.strategy.concurrent:  # the receivers meet the sender on the wire
            loads = {i: call_engine(self.engines, i, "load", "weight_sync", self.entry, "load", None, version)
                     for i in ids}
            return self._meet_on_wire(meta_ref, loads)
        else:
            meta = self._get(meta_ref, "the trainer's send")
            check_finite_checksums(meta.get("groups", {}))  # before any engine loads non-finite weights
            loads = {i: call_engine(self.engines, i, "load", "weight_sync", self.entry, "load", payload, version)
                     for i in ids}
            return meta, self._loads(loads)

    def _meet_on_wire(self, meta_ref, loads: dict) -> tuple[dict, dict[int, dict]]:
        """A concurrent strategy's transfer: (the sender's meta, {engine: its report}). A member lost on the wire
        fails the broadcast for every member (their errors are its consequence): EnginesLost names the lost ones
        once every call ended, each engine's verified version forgotten (the redo, on the re-formed group, probes
        them all)."""
        try:
            reports = gather_engines(loads, self.ws.timeout_s, "weight load", hold_errors=True)
        except EnginesLost:
            self.engine_versions = [None] * len(self.engines)
            try:  # the trainer's side of the broken broadcast ends too (its error is the loss's consequence)
                ray.get(meta_ref, timeout=self.ws.timeout_s)
            except Exception:  # noqa: BLE001 - read, so Ray does not report it as unhandled
                pass
            raise
        return self._get(meta_ref, f"the {self.name} transfer"), reports

    def _loads(self, loads: dict) -> dict[int, dict]:
        """{engine index: its report} of the engines' loads. Raises EnginesLost naming every engine that died
        or did not answer within weight_sync.timeout_s (after waiting for all of them)."""
        return gather_engines(loads, self.ws.timeout_s, "weight load")

    def _after_verified(self, version: int) -> None:
        """The sender's clean-up once every engine was verified on this version (only for senders that
        define one: no extra call otherwise)."""
        if self.strategy.sender.after_verified is WeightSender.after_verified:
            return
        if all(v == version for v in self.engine_versions):
            self._get(self.trainer.weight_sync.remote(self.entry, "after_verified", version),
                      "the sender's clean-up")

    def _verify(self, version: int, meta: dict, reports: dict[int, dict]) -> None:
        for i, rep in reports.items():
            if rep["version"] != version:
                raise WeightMismatchError(f"rollout worker {i} reports weight version {rep['version']}, expected {version}")
            if self.ws.verify:
                compare_checksums(meta["groups"], rep["groups"], where=f"rollout worker {i}")
                check_fp8_report(rep, where=f"rollout worker {i}")  # FP8 engines: their re-quantisation
            self.engine_versions[i] = version


def make_syncer(cfg, trainer, engines: list, strategy: Optional[str] = None) -> WeightSyncer:
    """The syncer for `strategy` (default `weight_sync.strategy`; `auto` must be resolved first), set up.
    Raises ValueError naming `weight_sync.strategy` and the registered names for an unknown strategy."""
    syncer = WeightSyncer(cfg, trainer, engines, get(strategy or cfg.weight_sync.strategy).name)
    syncer.setup()
    return syncer
