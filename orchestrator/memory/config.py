"""The `memory` section of the run config: the pre-flight memory plan that refuses a run that would not fit
(orchestrator/memory, `rl-orch plan memory`). Its fields state their ranges; no check involves other sections.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.fields import number


@dataclass
class MemoryConfig:
    # Pre-flight VRAM plan (orchestrator/memory, `rl-orch plan memory`): before any actor starts, the
    # run estimates every role's bytes per device and refuses to start when one does not fit.
    preflight: bool = True
    force: bool = False  # start even when the plan says it does not fit (`rl-orch run --force`)
    # memory of one device in GiB; 0 = the local GPU's, or on a CPU-only machine the host's RAM
    device_gib: float = number(0.0, ge=0, finite=True)
