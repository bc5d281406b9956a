"""rl-orchestrator: the driver side (config, controller, algorithms, placement, weight-sync planning)."""
from orchestrator.quiet_logs import install as _quiet

_quiet()
