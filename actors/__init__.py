"""rl-orchestrator's Ray actors (trainer, rollout workers, reference, reward, critic, environments)."""
from orchestrator.runtime.gc_tuning import install as _tune_gc
from orchestrator.runtime.quiet_logs import install as _quiet

_tune_gc()  # before torch, transformers and vLLM are imported: their imports run 18% faster
_quiet()
