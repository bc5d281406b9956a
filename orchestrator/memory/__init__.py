"""Memory planning (pure: no Ray, no vLLM): parameter counts (params), model shapes (shapes), per-role byte
formulas (estimate), the per-device plan with suggestions (planner) and the run's pre-flight check (preflight)."""
from orchestrator.memory.params import (PRESETS, ModelConfigError, ParamCount, count_params, load_hf_config,
                                        resolve_model_config)

__all__ = ["PRESETS", "ModelConfigError", "ParamCount", "count_params", "load_hf_config",
           "resolve_model_config"]
