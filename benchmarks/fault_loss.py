"""The policy loss `ppo_clip_nan_on_flag` (`algo.plugins=[benchmarks.fault_loss]`): `ppo_clip`, times NaN while
the flag `nan_loss` of benchmarks/fault_injection.py exists; the trainer then skips the update
(actor/skipped_updates). Used by benchmarks/faults.py."""
from __future__ import annotations

from benchmarks.fault_injection import FLAGS
from orchestrator.algo.loss import ppo_clip, register_policy_loss


@register_policy_loss("ppo_clip_nan_on_flag")
def ppo_clip_nan_on_flag(inputs, cfg):
    loss, metrics = ppo_clip(inputs, cfg)
    return (loss * float("nan") if (FLAGS / "nan_loss").exists() else loss), metrics
