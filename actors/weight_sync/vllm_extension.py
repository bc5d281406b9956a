"""vLLM worker extension that reports what the engine holds, and the test hooks of weight sync.

vLLM mixes this class into its worker (`worker_extension_cls`); `collective_rpc` calls its methods. The weights
themselves arrive through vLLM's own weight-transfer protocol (`init_weight_transfer_engine`, `start_weight_update`,
`update_weights`, `finish_weight_update`), served by our engine `StrategyTransferEngine`
(actors/weight_sync/transfer_engine.py), which importing this module registers with vLLM's factory in whichever
process builds the worker. Its loads go through vLLM's layerwise reload, which also redoes the backend's weight
post-processing (the CPU backend repacks linear weights).

Verification: checksums are read back from the engine's resident parameters. Where the backend has
moved a layer's weight into an opaque packed handle (vLLM's CPU oneDNN path leaves an empty
parameter behind), that tensor group is checksummed at the point of loading instead: the values the
model's weight loader consumed for this version. The integration tests also compare the engine's
logprobs with the trainer's after a sync, which covers the packed path end to end, and so does the
controller after every verified sync (the logprob probe, orchestrator/weight_sync/probe.py);
`corrupt_resident_weights` is its negative control: a resident kernel changed after a verified load.
"""
from __future__ import annotations

from typing import Optional

from actors.weight_sync import base, resident_faults
from actors.weight_sync.fp8_resident import online_fp8_layers
from actors.weight_sync.transfer_engine import StrategyTransferEngine
from orchestrator.weight_sync.checksum import checksum_group, group_checksums


class WeightReceiverExtension:
    """Methods run inside each vLLM worker process (or in-process on CPU), beside vLLM's weight-transfer calls.

    `weight_checksums` reports the version and checksums our engine (`self.weight_transfer_engine`, vLLM's attribute,
    a `StrategyTransferEngine`) recorded at its last load together with the resident weights; the other methods are
    test and debugging hooks.
    """

    def _transfer(self) -> Optional[StrategyTransferEngine]:
        engine = getattr(self, "weight_transfer_engine", None)
        return engine if isinstance(engine, StrategyTransferEngine) else None

    def _transfer_or_raise(self) -> StrategyTransferEngine:
        engine = self._transfer()
        if engine is None:
            raise RuntimeError("weight sync: this vLLM engine has no rl_orch weight-transfer engine (it was built "
                               "without weight_transfer_config={'backend': 'rl_orch'}: vllm_engine.engine_kwargs)")
        return engine

    def transfer_weights(self, update_info: dict) -> None:
        """vLLM's weight-update protocol as one call: the worker's `start_weight_update`, `update_weights(update_info)`
        ({"strategy", "payload", "version"}: actors/weight_sync/transfer_engine.py) and `finish_weight_update`. One
        RPC, so an engine core takes no step between them (a step then would run layers that are mid-reload). Raises
        what the transfer or its finish raised; the engine then reports no verified version (NO_VERSION) and the
        worker is out of the update, ready for the next one."""
        self.start_weight_update()
        self.update_weights(update_info)
        self.finish_weight_update()
        error = self._transfer_or_raise().take_finish_error()
        if error is not None:
            raise error

    def weight_checksums(self) -> dict:
        """{"version", "groups": {group: [sum, sumsq, numel]}, "packed_groups": [...]}, and for an FP8 engine
        "fp8": {"layers", "errors"} (orchestrator/weight_sync/fp8_check.py).

        Resident parameters are read back; groups with a parameter packed away by the backend
        (numel 0), and the groups of FP8 layers (whose resident FP8 weights and scales are checked against the
        re-quantisation of the loaded weights instead), report the checksums of the values loaded into them for
        this version, or are
        left out before the first sync (nothing was loaded through us yet). Under tensor parallelism
        (tp_size > 1) every parameter is a shard or a replica, so every group reports the checksums of the
        full tensors this worker's loader consumed (`verified_on: "load"`); the engine checks that all its
        workers agree (orchestrator.weight_sync.checksum.combine_worker_reports).
        """
        tp_rank, tp_size = base.tp_position()
        engine = self._transfer()
        version, loaded = (engine.version, dict(engine.loaded_checksums)) if engine is not None else (0, {})
        report = {"version": version, "tp_rank": tp_rank, "shadow_version": None}
        for receiver in (engine.receivers if engine is not None else {}).values():
            report.update(receiver.report())
        fp8 = set()
        if engine is not None and engine.fp8 is not None:  # FP8 layers: the stream's checksums, the re-quantisation
            model = self.model_runner.get_model()
            report["fp8"] = engine.fp8.report(model)
            fp8 = {checksum_group(f"{n}.weight") for n in online_fp8_layers(model)}
        if tp_size > 1:  # every resident tensor is a shard: report the full tensors the loader consumed
            return {**report, "groups": loaded, "packed_groups": sorted(loaded), "verified_on": "load"}
        # remove_duplicate=False: a tied output head is listed (and checked) under its own name too
        params = list(self.model_runner.get_model().named_parameters(remove_duplicate=False))
        packed = {checksum_group(n) for n, p in params if p.numel() == 0} | fp8
        groups = group_checksums((n, p) for n, p in params if checksum_group(n) not in packed)
        for g in packed:
            if g in loaded:
                groups[g] = loaded[g]
        return {**report, "groups": groups, "packed_groups": sorted(packed), "verified_on": "resident"}

    # ---- test and debugging hooks (each raises RuntimeError on an engine built without our weight transfer) ----
    def record_digests(self, on: bool = True) -> None:
        """Keep a SHA-256 of every tensor loaded from now on (bit-exactness checks; costs a hash pass)."""
        self._transfer_or_raise().digests = {} if on else None

    def loaded_digests(self) -> dict:
        """{name: sha256 hex} of the tensors of the last load (after `record_digests`)."""
        return dict(self._transfer_or_raise().digests or {})

    def inject_fault_next_load(self) -> None:
        """Corrupt one value of the next load (tests: verification must catch it)."""
        self._transfer_or_raise().faults.corrupt_first = True

    def inject_hang_next_load(self, seconds: float) -> None:
        """Block the next load for `seconds` (tests: weight_sync.timeout_s must catch it, the engine be replaced)."""
        self._transfer_or_raise().faults.hang_s = float(seconds)

    def inject_fault_after_next_load(self, scale: float = 2.0) -> None:
        """After the next load (whose stream and checksums are right), `corrupt_resident_weights(scale)`
        (tests: the logprob probe must catch what the checksums cannot)."""
        self._transfer_or_raise().faults.scale_after = float(scale)

    def corrupt_fp8_scale(self, factor: float = 2.0) -> str:
        """Multiply the first online-FP8 layer's resident weight scale by `factor` after a verified load (tests:
        the FP8 check must catch it). Returns the layer's name; raises StopIteration without FP8 layers."""
        name, layer = next(iter(online_fp8_layers(self.model_runner.get_model()).items()))
        layer.weight_scale.data.mul_(factor)
        return name

    def corrupt_resident_weights(self, scale: float = 2.0, layer: str = "") -> dict:
        """`resident_faults.corrupt_resident_weights` on this engine's model (tests: the probe's negative control)."""
        return resident_faults.corrupt_resident_weights(self.model_runner.get_model(), scale, layer)

    def swap_resident_logits(self, a: list[int], b: list[int]) -> None:
        """`resident_faults.swap_resident_logits` on this engine's model (tests: the probe's full-distribution check)."""
        resident_faults.swap_resident_logits(self.model_runner.get_model(), a, b)
