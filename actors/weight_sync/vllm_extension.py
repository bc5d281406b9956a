"""vLLM worker extension that receives new policy weights and reports what the engine holds.

vLLM mixes this class into its worker (`worker_extension_cls`); `collective_rpc` calls its methods. Every
strategy's receiver (actors/weight_sync/<strategy>.py) is reached through one entry point, `weight_sync`.
Weights load through the worker's `reload_weights(weights_iterator=...)`, which also redoes the
backend's weight post-processing (the CPU backend repacks linear weights; a plain
`model.load_weights` would leave stale packed copies in use).

Verification: checksums are read back from the engine's resident parameters. Where the backend has
moved a layer's weight into an opaque packed handle (vLLM's CPU oneDNN path leaves an empty
parameter behind), that tensor group is checksummed at the point of loading instead: the values the
model's weight loader consumed for this version. The integration tests also compare the engine's
logprobs with the trainer's after a sync, which covers the packed path end to end, and so does the
controller after every verified sync (the logprob probe, orchestrator/weight_sync/probe.py);
`corrupt_resident_weights` is its negative control: a resident kernel changed after a verified load.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any, Iterable, Optional

import torch

from actors.weight_sync import base
from actors.weight_sync.base import WeightReceiver
from actors.weight_sync.fp8_resident import FP8Verifier, online_fp8_layers
from orchestrator.weight_sync.checksum import add_checksum, checksum_group, group_checksums
from orchestrator.weight_sync.registry import StrategyEntry, get


class WeightReceiverExtension:
    """Methods run inside each vLLM worker process (or in-process on CPU).

    `weight_sync(strategy, method, *args)` is the one entry point of every strategy's receiver
    (actors/weight_sync/<strategy>.py): "connect" makes this worker's receiver, "load" streams its
    (name, tensor) pairs into `_load`, any other name calls that receiver method. `_load` feeds
    `reload_weights`, records the group checksums of what was loaded, and sets the weight version only
    after the load completed.
    """

    weight_version: int = 0
    _loaded_checksums: dict = {}
    _receivers: Optional[dict] = None  # strategy name -> WeightReceiver of this worker
    _digests: Optional[dict] = None
    _fault_next_load: bool = False
    _hang_next_load_s: float = 0.0
    _fault_after_load: float = 0.0  # tests: scale one layer's resident weights right after the next load
    _fp8: Optional[FP8Verifier] = None  # FP8 engines: what each sync's re-quantisation gave (fp8_resident.py)

    def weight_sync(self, strategy: StrategyEntry | str, method: str, *args) -> Any:
        """Run `method` of `strategy`'s receiver (a registry entry, or a registered name): "connect"
        (info, engine_index) makes a fresh receiver and connects it; "load" (payload, version) loads
        `receiver.stream(payload, version)` and returns None; other methods are called as they are. A
        receiver is made on first use (strategies that need `connect` raise from their own methods)."""
        entry = get(strategy) if isinstance(strategy, str) else strategy
        if self._receivers is None:
            self._receivers = {}
        if method == "connect" or entry.name not in self._receivers:
            self._receivers[entry.name] = entry.load().receiver()
        receiver = self._receivers[entry.name]
        if method == "load":
            payload, version = args
            return self._load(receiver.stream(payload, version), version, receiver)
        return getattr(receiver, method)(*args)

    def _load(self, stream: Iterable[tuple[str, torch.Tensor]], version: int,
              receiver: Optional[WeightReceiver] = None) -> None:
        receiver = receiver or WeightReceiver()
        if self._hang_next_load_s:  # fault injection (tests): an engine that stops answering mid-sync
            time.sleep(self._hang_next_load_s)
            self._hang_next_load_s = 0.0
        device = next(self.model_runner.get_model().parameters()).device
        if self._fp8 is None and online_fp8_layers(self.model_runner.get_model()):
            self._fp8 = FP8Verifier()
            self._fp8.install(self.model_runner.get_model())
        if self._fp8 is not None:
            self._fp8.begin()
        checks: dict = {}
        digests: Optional[dict] = {} if self._digests is not None else None

        def tap():
            for i, (name, t) in enumerate(stream):
                if self._fault_next_load and i == 0:
                    t = t.clone()
                    t.view(-1)[0] += 1.0  # fault injection (tests): one corrupted value in the first bucket
                add_checksum(checks, name, t)
                receiver.loaded_tensor(name, t)
                if digests is not None:
                    digests[name] = _digest(t)
                yield name, t.to(device)

        self.reload_weights(weights_iterator=tap())
        self._retie_output_embeddings()
        if self._fault_after_load:  # fault injection (tests): the stream was right, the resident kernel is not
            self.corrupt_resident_weights(self._fault_after_load)
            self._fault_after_load = 0.0
        self._fault_next_load = False
        self._loaded_checksums, self.weight_version = checks, version
        receiver.loaded(version)
        if digests is not None:
            self._digests = digests

    def _retie_output_embeddings(self) -> None:
        """vLLM's layerwise reload unties tied embeddings and puts the output head's old kernel back
        (its `Failed to load weights` warning): tie the head to the new embedding again and redo its
        post-processing (the CPU backend packs the head's weight for its GEMM)."""
        model = self.model_runner.get_model()
        if not getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False):
            return
        head = getattr(model, "lm_head", None)
        embeds = [m for m in model.modules() if type(m).__name__ == "VocabParallelEmbedding"]
        if head is None or len(embeds) != 1 or not hasattr(head, "weight"):
            return
        embed = embeds[0]
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)

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
        report = {"version": self.weight_version, "tp_rank": tp_rank, "shadow_version": None}
        for receiver in (self._receivers or {}).values():
            report.update(receiver.report())
        fp8 = set()
        if self._fp8 is not None:  # FP8 layers: the stream's checksums, and the re-quantisation check
            model = self.model_runner.get_model()
            report["fp8"] = self._fp8.report(model)
            fp8 = {checksum_group(f"{n}.weight") for n in online_fp8_layers(model)}
        if tp_size > 1:  # every resident tensor is a shard: report the full tensors the loader consumed
            loaded = dict(self._loaded_checksums)
            return {**report, "groups": loaded, "packed_groups": sorted(loaded), "verified_on": "load"}
        # remove_duplicate=False: a tied output head is listed (and checked) under its own name too
        params = list(self.model_runner.get_model().named_parameters(remove_duplicate=False))
        packed = {checksum_group(n) for n, p in params if p.numel() == 0} | fp8
        groups = group_checksums((n, p) for n, p in params if checksum_group(n) not in packed)
        for g in packed:
            if g in self._loaded_checksums:
                groups[g] = self._loaded_checksums[g]
        return {**report, "groups": groups, "packed_groups": sorted(packed), "verified_on": "resident"}

    # ---- test and debugging hooks -------------------------------------------------------------
    def record_digests(self, on: bool = True) -> None:
        """Keep a SHA-256 of every tensor loaded from now on (bit-exactness checks; costs a hash pass)."""
        self._digests = {} if on else None

    def loaded_digests(self) -> dict:
        """{name: sha256 hex} of the tensors of the last load (after `record_digests`)."""
        return dict(self._digests or {})

    def inject_fault_next_load(self) -> None:
        """Corrupt one value of the next load (tests: verification must catch it)."""
        self._fault_next_load = True

    def inject_hang_next_load(self, seconds: float) -> None:
        """Block the next load for `seconds` (tests: weight_sync.timeout_s must catch it, the engine be replaced)."""
        self._hang_next_load_s = float(seconds)

    def inject_fault_after_next_load(self, scale: float = 2.0) -> None:
        """After the next load (whose stream and checksums are right), `corrupt_resident_weights(scale)`
        (tests: the logprob probe must catch what the checksums cannot)."""
        self._fault_after_load = float(scale)

    def corrupt_fp8_scale(self, factor: float = 2.0) -> str:
        """Multiply the first online-FP8 layer's resident weight scale by `factor` after a verified load (tests:
        the FP8 check must catch it). Returns the layer's name; raises StopIteration without FP8 layers."""
        name, layer = next(iter(online_fp8_layers(self.model_runner.get_model()).items()))
        layer.weight_scale.data.mul_(factor)
        return name

    def corrupt_resident_weights(self, scale: float = 2.0, layer: str = "") -> dict:
        """Make one linear layer compute with its weight times `scale`, bypassing the weight stream and leaving
        the recorded checksums alone (tests). `layer`: a module name, default the first decoder layer's
        `mlp.down_proj`. A layer served by vLLM's CPU GEMM dispatch (`cpu_linear`, over a packed copy when its
        parameter was emptied) gets that kernel's output scaled; any other has its resident weight scaled in
        place. Returns {"layer": its name, "packed": whether its parameter is empty (packed away)}. Raises
        KeyError for an unknown `layer`. The next load rebuilds the layer and undoes this."""
        modules = dict(self.model_runner.get_model().named_modules())
        name = layer or next(n for n in modules if n.endswith("layers.0.mlp.down_proj"))
        mod = modules[name]
        packed = mod.weight.numel() == 0
        if callable(getattr(mod, "cpu_linear", None)):
            inner = mod.cpu_linear
            mod.cpu_linear = lambda x, weight, bias: inner(x, weight, bias) * scale
        else:
            mod.weight.data.mul_(scale)
        return {"layer": name, "packed": packed}

    def swap_resident_logits(self, a: list[int], b: list[int]) -> None:
        """Make the model's logits of token ids `a[i]` and `b[i]` trade places, bypassing the weights (tests: wrong
        output rows outside the sampled tokens, which leave every other token's logprob bit-equal; the probe's
        full-distribution check must catch it). Called again with the same ids, it undoes itself."""
        model, src, dst = self.model_runner.get_model(), list(a) + list(b), list(b) + list(a)
        inner = model.compute_logits

        def swapped(hidden_states, *args, **kwargs):
            logits = inner(hidden_states, *args, **kwargs)
            if logits is not None:
                logits[..., src] = logits[..., dst]
            return logits

        model.compute_logits = swapped


def _digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype and shape not included)."""
    x = t.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(x.view(torch.uint8).numpy().tobytes()).hexdigest()
