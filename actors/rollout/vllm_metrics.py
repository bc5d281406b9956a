"""vLLM's own engine metrics into Ray's metrics pipeline (Prometheus `ray_vllm_*`).

The rollout engines are vLLM's offline `LLM` class, whose constructor takes no stat loggers: it records
vLLM's metrics (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_hits`,
`vllm:generation_tokens`, the time-to-first-token and inter-token histograms, ...) only into the process's
own prometheus_client registry, which nothing scrapes inside a Ray actor. `export_to_ray` replaces the
engine's stat-logger manager with one that records every step into both vLLM's `PrometheusStatLogger` (the
local registry that `LLM.get_metrics()` and the rollout worker's cache counters read) and vLLM's
`RayPrometheusStatLogger` (ray.util.metrics: each node's Ray metrics agent exports them, with Ray's `ray_`
prefix and `:` turned into `_`, e.g. `ray_vllm_generation_tokens_total`). That is how vLLM itself exports
engine metrics under Ray (`vllm.v1.metrics.ray_wrappers`); the `ray` scrape job of
deploy/prometheus/prometheus.yml, the Helm chart and the Slurm launcher's config then collects them.
"""
from __future__ import annotations


def export_to_ray(llm) -> bool:  # llm: a vllm.LLM or a vLLM AsyncLLM
    """Record the engine's metrics through Ray as well as locally. Returns False (and changes nothing) when
    the engine logs no stats (`disable_log_stats=True`) or Ray is not initialised in this process.

    Raises RuntimeError when this vLLM's `LLMEngine` has no `logger_manager`/`vllm_config` (an
    incompatible vLLM version), naming the missing attribute.
    """
    import ray

    if not ray.is_initialized():
        return False
    engine = getattr(llm, "llm_engine", llm)  # vllm.LLM's LLMEngine; an AsyncLLM has both attributes itself
    for attr in ("logger_manager", "vllm_config"):
        if not hasattr(engine, attr):
            raise RuntimeError(f"vLLM's LLMEngine has no {attr!r}: cannot export vLLM metrics through Ray "
                               "with this vLLM version; set rollout.ray_metrics=false")
    if engine.logger_manager is None:
        return False
    from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerManager
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    old = engine.logger_manager
    manager = StatLoggerManager(vllm_config=engine.vllm_config, engine_idxs=list(old.engine_indexes),
                                custom_stat_loggers=[RayPrometheusStatLogger, PrometheusStatLogger],
                                enable_default_loggers=False)
    manager.log_engine_initialized()
    engine.logger_manager = manager
    return True
