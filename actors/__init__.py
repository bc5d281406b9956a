"""rl-orchestrator's Ray actors (trainer, rollout workers, reference, reward, critic, environments)."""
from orchestrator.quiet_logs import install as _quiet

_quiet()
