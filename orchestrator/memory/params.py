"""Parameter counts from a Hugging Face `config.json`, for memory and weight-sync planning (pure).

    count_params(PRESETS["llama3-8b"])           # ParamCount(total=8030261248, active=8030261248)
    count_params(load_hf_config("/models/qwen")) # a config.json path or a model folder

Counts the weights of the decoder stack as the HF modelling code builds them: token embeddings, the
LM head (absent when `tie_word_embeddings`), per layer the attention projections (grouped-query with
`num_key_value_heads` and `head_dim`, optional biases, Qwen3's per-head q/k norms, or DeepSeek's
multi-head latent attention), the gated MLP (gate, up, down) or a mixture of experts (router, experts,
shared experts), two RMSNorms per layer and the final norm. `active` counts the experts a token uses
(num_experts_per_tok routed + shared) instead of all of them; for dense models active == total.
Not counted: multi-token-prediction heads (DeepSeek-V3 `num_nextn_predict_layers`), vision towers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelConfigError(ValueError):
    """A model config is missing, malformed or lacks a key; the message names the file and the key."""


@dataclass(frozen=True)
class ParamCount:
    """total: every parameter; active: parameters one token passes through (== total for dense models)."""

    total: int
    active: int


def config_value(cfg: dict[str, Any], key: str, source: str, default: Any = ...) -> int:
    """cfg[key] as a non-negative int; `default` when absent or null, ModelConfigError when required."""
    value = cfg.get(key)
    if value is None:
        if default is ...:
            raise ModelConfigError(f"{source}: missing key {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(f"{source}: key {key!r} must be a non-negative integer (got {value!r})")
    return value


def _attention_params(cfg: dict[str, Any], source: str) -> int:
    """One layer's attention weights (+ biases / q-k norms), as in HF Llama / Qwen2 / Qwen3 / DeepSeek."""
    hidden = config_value(cfg, "hidden_size", source)
    heads = config_value(cfg, "num_attention_heads", source)
    if cfg.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention
        nope, rope = config_value(cfg, "qk_nope_head_dim", source), config_value(cfg, "qk_rope_head_dim", source)
        v_dim, kv_rank = config_value(cfg, "v_head_dim", source), cfg["kv_lora_rank"]
        q_rank = cfg.get("q_lora_rank")
        q = hidden * heads * (nope + rope) if not q_rank else \
            hidden * q_rank + q_rank + q_rank * heads * (nope + rope)
        kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    if heads == 0:
        raise ModelConfigError(f"{source}: key 'num_attention_heads' must be >= 1 (got 0)")
    kv_heads = config_value(cfg, "num_key_value_heads", source, heads)
    head_dim = config_value(cfg, "head_dim", source, hidden // heads)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    params = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    model_type = str(cfg.get("model_type", ""))
    # Qwen2 / Qwen2-MoE always carry q/k/v biases; others only with `attention_bias` (o bias too).
    if model_type in ("qwen2", "qwen2_moe"):
        params += q_out + 2 * kv_out
    elif cfg.get("attention_bias"):
        params += q_out + 2 * kv_out + hidden
    if model_type.startswith("qwen3"):  # per-head RMSNorm on q and k
        params += 2 * head_dim
    return params


def _mlp_params(hidden: int, intermediate: int, bias: bool = False) -> int:
    """Gated MLP: gate and up (hidden -> intermediate), down (intermediate -> hidden)."""
    return 3 * hidden * intermediate + (2 * intermediate + hidden if bias else 0)


def _moe_layout(cfg: dict[str, Any], source: str) -> dict[str, int] | None:
    """Experts per MoE layer (routed, per token, sizes, shared) or None for a dense model."""
    hidden = config_value(cfg, "hidden_size", source)
    if cfg.get("num_local_experts"):  # Mixtral: experts as large as `intermediate_size`, no shared expert
        return dict(routed=cfg["num_local_experts"], per_tok=config_value(cfg, "num_experts_per_tok", source),
                    size=config_value(cfg, "intermediate_size", source), shared=0, shared_gate=0)
    if cfg.get("n_routed_experts"):  # DeepSeek-V2/V3: n_shared_experts of moe_intermediate_size each
        size = config_value(cfg, "moe_intermediate_size", source)
        return dict(routed=cfg["n_routed_experts"], per_tok=config_value(cfg, "num_experts_per_tok", source),
                    size=size, shared=cfg.get("n_shared_experts", 0) * size, shared_gate=0,
                    router_bias=cfg["n_routed_experts"] if cfg.get("topk_method") == "noaux_tc" else 0)
    if cfg.get("num_experts"):  # Qwen2-MoE / Qwen3-MoE: optional shared expert with a sigmoid gate
        shared = cfg.get("shared_expert_intermediate_size") or 0
        return dict(routed=cfg["num_experts"], per_tok=config_value(cfg, "num_experts_per_tok", source),
                    size=config_value(cfg, "moe_intermediate_size", source), shared=shared,
                    shared_gate=hidden if shared else 0)
    return None


def _is_moe_layer(cfg: dict[str, Any], index: int) -> bool:
    """Which layers are sparse: DeepSeek `first_k_dense_replace`/`moe_layer_freq`, Qwen
    `mlp_only_layers`/`decoder_sparse_step`; every layer otherwise."""
    if index < (cfg.get("first_k_dense_replace") or 0) or index in (cfg.get("mlp_only_layers") or []):
        return False
    if cfg.get("first_k_dense_replace") is not None:
        return index % (cfg.get("moe_layer_freq") or 1) == 0
    return (index + 1) % (cfg.get("decoder_sparse_step") or 1) == 0


def count_params(hf_config: dict[str, Any], source: str = "config") -> ParamCount:
    """Total and active parameter counts of a decoder-only LM from its HF config dict.

    Multimodal configs with a `text_config` are counted from it (the language model only).
    Raises ModelConfigError naming `source` and the missing key.
    """
    if not isinstance(hf_config, dict):
        raise ModelConfigError(f"{source}: expected a dict, got {type(hf_config).__name__}")
    cfg = hf_config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    hidden = config_value(cfg, "hidden_size", source)
    layers = config_value(cfg, "num_hidden_layers", source)
    vocab = config_value(cfg, "vocab_size", source)
    embed = vocab * hidden
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * hidden
    attention = _attention_params(cfg, source)
    moe = _moe_layout(cfg, source)
    mlp_bias = bool(cfg.get("mlp_bias"))
    total = active = embed + head + hidden  # + final norm
    for index in range(layers):
        base = attention + 2 * hidden  # + input and post-attention RMSNorm
        if moe is None or not _is_moe_layer(cfg, index):
            dense = base + _mlp_params(hidden, config_value(cfg, "intermediate_size", source), mlp_bias)
            total, active = total + dense, active + dense
            continue
        expert = _mlp_params(hidden, moe["size"])
        shared = _mlp_params(hidden, moe["shared"]) if moe["shared"] else 0
        router = hidden * moe["routed"] + moe.get("router_bias", 0) + moe["shared_gate"]
        total += base + router + shared + moe["routed"] * expert
        active += base + router + shared + moe["per_tok"] * expert
    return ParamCount(total=int(total), active=int(active))


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The dict of a `config.json` given its path or the model folder holding it.

    Raises ModelConfigError naming the path when the file is missing, is not a JSON object, or lacks a
    key that `count_params` needs (the message then names the key too).
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelConfigError(f"{file}: no such file (expected a config.json or a model folder holding one)")
    try:
        cfg = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    count_params(cfg, source=str(file))  # fail now, naming the file and the key, rather than later
    return cfg


def resolve_model_config(spec: str) -> dict[str, Any]:
    """A preset name (see PRESETS), a config.json path or a model folder -> the config dict.

    Raises ModelConfigError naming `spec` and the preset names when it is none of these.
    """
    if spec in PRESETS:
        return dict(PRESETS[spec])
    if Path(spec).exists():
        return load_hf_config(spec)
    raise ModelConfigError(f"{spec}: neither a preset ({', '.join(PRESETS)}) nor an existing path")


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
           tied: bool, **extra: Any) -> dict[str, Any]:
    return dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                tie_word_embeddings=tied, **extra)


# The shape keys of each model's published config.json (Hugging Face hub), enough for count_params.
PRESETS: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct): 134,515,008 parameters.
    "smollm2-135m": _llama(576, 30, 9, 3, 1536, 49152, True),
    # meta-llama/Meta-Llama-3(.1)-8B: 8.03e9.
    "llama3-8b": _llama(4096, 32, 32, 8, 14336, 128256, False),
    # meta-llama/Meta-Llama-3(.1)-70B: 70.55e9.
    "llama3-70b": _llama(8192, 80, 64, 8, 28672, 128256, False),
    # Qwen/Qwen2.5-7B(-Instruct): 7.62e9 (q/k/v biases).
    "qwen2.5-7b": dict(_llama(3584, 28, 28, 4, 18944, 152064, False), model_type="qwen2"),
    # mistralai/Mixtral-8x7B-v0.1: 46.7e9 total, 12.9e9 active (top-2 of 8).
    "mixtral-8x7b": dict(_llama(4096, 32, 32, 8, 14336, 32000, False), model_type="mixtral",
                         num_local_experts=8, num_experts_per_tok=2),
    # Qwen/Qwen3-30B-A3B: 30.5e9 total, 3.3e9 active (8 of 128 experts).
    "qwen3-30b-a3b": dict(_llama(2048, 48, 32, 4, 6144, 151936, False), model_type="qwen3_moe",
                          head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    # Qwen/Qwen3-235B-A22B: 235e9 total, 22e9 active (8 of 128 experts).
    "qwen3-235b-a22b": dict(_llama(4096, 94, 64, 4, 12288, 151936, False), model_type="qwen3_moe",
                            head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536),
    # deepseek-ai/DeepSeek-V3: 671e9 total, 37e9 active (MLA; 3 dense layers; 8 of 256 + 1 shared).
    "deepseek-v3": dict(_llama(7168, 61, 128, 128, 18432, 129280, False), model_type="deepseek_v3",
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                        moe_intermediate_size=2048, first_k_dense_replace=3, moe_layer_freq=1,
                        topk_method="noaux_tc"),
}
