"""vLLM worker extension that receives new policy weights and reports what the engine holds.

vLLM mixes this class into its worker (`worker_extension_cls`); `collective_rpc` calls its methods.
Weights load through the worker's `reload_weights(weights_iterator=...)`, which also redoes the
backend's weight post-processing (the CPU backend repacks linear weights; a plain
`model.load_weights` would leave stale packed copies in use).

Verification: checksums are read back from the engine's resident parameters. Where the backend has
moved a layer's weight into an opaque packed handle (vLLM's CPU oneDNN path leaves an empty
parameter behind), that tensor group is checksummed at the point of loading instead: the values the
model's weight loader consumed for this version. The integration tests also compare the engine's
logprobs with the trainer's after a sync, which covers the packed path end to end.
"""
from __future__ import annotations

import torch

from orchestrator.sync import checksum_group, group_checksums


class WeightReceiverExtension:
    """Methods run inside each vLLM worker process (or in-process on CPU)."""

    weight_version: int = 0
    _loaded_checksums: dict = {}

    def load_named_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-named tensors (fused names are handled by the model's own loader)."""
        device = next(self.model_runner.get_model().parameters()).device
        self._loaded_checksums = group_checksums(named_tensors)
        self.reload_weights(weights_iterator=((n, t.to(device)) for n, t in named_tensors))
        self._retie_output_embeddings()
        self.weight_version = version

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
        """{"version", "groups": {group: [sum, sumsq, numel]}, "packed_groups": [...]}.

        Resident parameters are read back; groups with a parameter packed away by the backend
        (numel 0) report the checksums of the values loaded into them for this version, or are
        left out before the first sync (nothing was loaded through us yet).
        """
        # remove_duplicate=False: a tied output head is listed (and checked) under its own name too
        params = list(self.model_runner.get_model().named_parameters(remove_duplicate=False))
        packed = {checksum_group(n) for n, p in params if p.numel() == 0}
        groups = group_checksums((n, p) for n, p in params if checksum_group(n) not in packed)
        for g in packed:
            if g in self._loaded_checksums:
                groups[g] = self._loaded_checksums[g]
        return {"version": self.weight_version, "groups": groups, "packed_groups": sorted(packed)}
