"""Controller side of weight sync: the strategy registry, the cost model, checksums, buckets, deltas.

The package and its modules are pure (no Ray, no vLLM) except `syncer.py`, the controller's generic
syncer, which drives the trainer and the engines through Ray (import it as
`orchestrator.weight_sync.syncer`). The senders and receivers live in actors/weight_sync/.
"""
from orchestrator.weight_sync.checksum import (NonFiniteWeightsError, WeightMismatchError, check_finite_checksums,
                                               checksum_group, compare_checksums, group_checksums)
from orchestrator.weight_sync.cost_model import (FABRICS, SyncEstimate, SyncSetup, SyncSetupError, fabric_gbps,
                                                 setup_from_fabric)
from orchestrator.weight_sync.registry import choose_strategy, predict_sync, priced_names, register, strategy_names

__all__ = ["NonFiniteWeightsError", "WeightMismatchError", "check_finite_checksums", "checksum_group",
           "compare_checksums", "group_checksums",
           "FABRICS", "SyncEstimate", "SyncSetup", "SyncSetupError", "choose_strategy",
           "fabric_gbps", "predict_sync", "priced_names", "register", "setup_from_fabric", "strategy_names"]
