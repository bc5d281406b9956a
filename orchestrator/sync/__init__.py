"""Weight-sync planning and verification (pure: no Ray, no vLLM)."""
from orchestrator.sync.checksum import WeightMismatchError, checksum_group, compare_checksums, group_checksums
from orchestrator.sync.cost_model import (FABRICS, STRATEGIES, SyncEstimate, SyncSetup, SyncSetupError,
                                          choose_strategy, fabric_gbps, predict_sync, setup_from_fabric)

__all__ = ["WeightMismatchError", "checksum_group", "compare_checksums", "group_checksums",
           "FABRICS", "STRATEGIES", "SyncEstimate", "SyncSetup", "SyncSetupError", "choose_strategy",
           "fabric_gbps", "predict_sync", "setup_from_fabric"]
