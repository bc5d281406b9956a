"""The numbers of a model that memory planning needs, from an HF config.json or from a few numbers (pure).

    shape = model_shape(PRESETS["llama3-8b"], name="llama3-8b")
    shape.kv_bytes_per_token(2)          # 131072: 2 * 32 layers * 8 kv heads * 128 head dim * 2 bytes (C13)
    shape = shape_from_numbers(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256)

Parameter counts come from `orchestrator.memory.params.count_params`, which follows the HF modelling code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.memory.params import ModelConfigError, config_value, count_params

# The projections peft targets by default in this project (trainer.lora.target_modules).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only LM's shape. Widths in elements; `num_params` / `active_params` from count_params.

    experts: routed experts per MoE layer (0 = dense); experts_per_token: routed experts a token uses;
    moe_intermediate: width of one expert's MLP; kv_latent: MLA's cached width per token and layer
    (kv_lora_rank + qk_rope_head_dim, DeepSeek-V2/V3), 0 for ordinary (grouped-query) attention.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    num_params: int
    active_params: int
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    kv_latent: int = 0

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token holds over all layers: 2 (K and V) * layers * kv_heads * head_dim
        * dtype bytes (vLLM's paged KV cache, Kwon et al. 2023; case C13 - key/value heads, never query
        heads). MLA caches one latent of `kv_latent` elements per layer instead of K and V."""
        if self.kv_latent:
            return self.layers * self.kv_latent * dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    @property
    def largest_param(self) -> int:
        """Elements of the largest single weight: the embedding (vocab x hidden) for every LM here."""
        return max(self.vocab * self.hidden, self.hidden * max(self.intermediate, self.moe_intermediate))

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (all experts), from the count minus embeddings and head."""
        outside = self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden
        return max(0, (self.num_params - outside) // max(1, self.layers))

    def lora_params(self, rank: int, targets: tuple[str, ...] = DEFAULT_LORA_TARGETS) -> int:
        """Adapter parameters for LoRA of `rank` on `targets` in every layer: rank * (in + out) per
        adapted matrix (Hu et al. 2021, sec. 4). MoE experts' projections each get their own adapter."""
        if rank <= 0:
            return 0
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h = self.hidden
        mlp_copies, width = (self.experts, self.moe_intermediate) if self.experts else (1, self.intermediate)
        size = {"q_proj": h + q_out, "k_proj": h + kv_out, "v_proj": h + kv_out, "o_proj": q_out + h,
                "gate_proj": (h + width) * mlp_copies, "up_proj": (h + width) * mlp_copies,
                "down_proj": (width + h) * mlp_copies}
        return rank * self.layers * sum(size.get(t, 0) for t in targets)


def model_shape(hf_config: dict[str, Any], name: str = "model") -> ModelShape:
    """ModelShape from an HF config dict (the `text_config` of a multimodal one).

    Raises ModelConfigError naming `name` and the missing or malformed key.
    """
    count = count_params(hf_config, source=name)
    cfg = hf_config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    hidden, heads = config_value(cfg, "hidden_size", name), config_value(cfg, "num_attention_heads", name)
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    moe_inter = cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0) or 0
    kv_latent = (cfg["kv_lora_rank"] + config_value(cfg, "qk_rope_head_dim", name)) if cfg.get("kv_lora_rank") else 0
    return ModelShape(
        name=name, layers=config_value(cfg, "num_hidden_layers", name), hidden=hidden,
        intermediate=config_value(cfg, "intermediate_size", name, 0), heads=heads,
        kv_heads=config_value(cfg, "num_key_value_heads", name, heads),
        head_dim=config_value(cfg, "head_dim", name, hidden // heads if heads else 0),
        vocab=config_value(cfg, "vocab_size", name), tied=bool(cfg.get("tie_word_embeddings", False)),
        num_params=count.total, active_params=count.active, experts=int(experts),
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate=int(moe_inter), kv_latent=int(kv_latent))


def shape_from_numbers(layers: int, hidden: int, intermediate: int, heads: int, vocab: int,
                       kv_heads: int | None = None, experts: int = 0, experts_per_token: int = 2,
                       tied: bool = False, name: str = "custom") -> ModelShape:
    """ModelShape of a Llama-style model (Mixtral-style MoE with `experts` > 0) from its numbers.

    Raises ModelConfigError naming the number that is not a positive integer, or kv_heads that does
    not divide heads.
    """
    numbers = dict(layers=layers, hidden=hidden, intermediate=intermediate, heads=heads, vocab=vocab)
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(f"{key}: must be a positive integer (got {value!r})")
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ModelConfigError(f"kv_heads: must be a positive divisor of heads={heads} (got {kv_heads!r})")
    cfg: dict[str, Any] = dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=kv_heads,
                               intermediate_size=intermediate, vocab_size=vocab, tie_word_embeddings=tied)
    if experts:
        if not 1 <= experts_per_token <= experts:
            raise ModelConfigError(f"experts_per_token: must be in [1, experts={experts}] (got {experts_per_token})")
        cfg.update(model_type="mixtral", num_local_experts=experts, num_experts_per_tok=experts_per_token)
    return model_shape(cfg, name=name)
