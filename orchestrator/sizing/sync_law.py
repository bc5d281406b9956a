"""Weight-sync law from the cost model, for sizing a cluster other than the one the metrics came from.

Pure Python. `sync_law_from_cost_model` asks orchestrator.weight_sync.registry.predict_sync for the sync
seconds at several rollout sizes (engines of `gpus_per_engine` GPUs each, on nodes of `gpus_per_node`
GPUs apart from the trainer's) and fits the sizer's sync law t(g) = a + b * g to them
(orchestrator.sizing.scaling.fit_law, role "sync"). The cost model's formulas grow linearly with the
receiver count R and the engine nodes N (see its docstrings), so the line is exact within one fabric.
"""
from __future__ import annotations

import math

from orchestrator.sizing.scaling import Law, fit_law
from orchestrator.weight_sync.cost_model import setup_from_fabric
from orchestrator.weight_sync.registry import predict_sync, priced_names


def sync_law_from_cost_model(num_params: float, bytes_per_param: float = 2.0, strategy: str = "nccl",
                             gpus_per_engine: int = 1, gpus_per_node: int = 8, intra: str = "nvlink",
                             inter: str = "ib400", max_gpus: int = 1024) -> Law:
    """The sync law (seconds vs rollout GPUs g) fitted to the cost model at g = k * gpus_per_engine for
    k = 1, 2, 4, ... up to max_gpus; engine_nodes = ceil(g / gpus_per_node) (engines apart from the
    trainer's node, as in a disaggregated placement).

    Raises ValueError naming the argument for an unknown strategy or fabric, and SyncSetupError (a
    ValueError) for out-of-range sizes."""
    if strategy not in priced_names():
        raise ValueError(f"strategy: expected one of {list(priced_names())} (the strategies with a cost model; got "
                         f"{strategy!r})")
    if gpus_per_engine < 1 or gpus_per_node < 1:
        raise ValueError(f"gpus_per_engine and gpus_per_node: must be >= 1 (got {gpus_per_engine}, {gpus_per_node})")
    points = []
    engines = 1
    while engines * gpus_per_engine <= max(max_gpus, gpus_per_engine):
        g = engines * gpus_per_engine
        setup = setup_from_fabric(num_params, bytes_per_param, engines, gpus_per_engine,
                                  min(g, math.ceil(g / gpus_per_node)), intra=intra, inter=inter)
        points.append((g, predict_sync(setup)[strategy].seconds))
        engines *= 2
    law = fit_law("sync", points)
    return Law(law.a, law.b, law.alpha, f"cost model ({strategy}, {num_params:.3g} params, {intra}/{inter}), "
                                        f"{law.note}")
