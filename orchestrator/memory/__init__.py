"""Memory planning (pure: no Ray, no vLLM): parameter counts now; the VRAM estimator sits beside them."""
from orchestrator.memory.params import (PRESETS, ModelConfigError, ParamCount, count_params, load_hf_config,
                                        resolve_model_config)

__all__ = ["PRESETS", "ModelConfigError", "ParamCount", "count_params", "load_hf_config",
           "resolve_model_config"]
