"""LoRA for the policy trainer through peft: wrap the model, export merged weights, checkpoint adapters.

With `trainer.lora.rank > 0` the trainer's model gets peft LoRA layers injected (in place: the model
object stays the transformers class, so `actors/model/forward.py`'s fast path and every `self.model` use keep
working); only the adapter matrices require gradients. Weight sync and the checkpoint's `policy/` folder
get *merged* weights ``W + (alpha / rank) * B @ A`` (peft's `get_delta_weight`) under the base model's
HF names, computed without touching the live parameters, so the existing senders, checksums and vLLM
engines see a normal dense model. The adapter itself (peft format) goes to `policy_adapter/` next to
`policy/`; a resume restores it there and leaves the base weights (= `model.path`) untouched.

    peft_model = apply_lora(model, cfg.trainer.lora)        # None when rank == 0
    named = merged_state_dict(model)                         # {HF name: tensor}, lora_* entries folded in

FSDP2-sharded trainers (trainer.num_workers > 1, actors/trainer/sharded.py) shard the adapters with the
layers; they gather the full state dict first and pass it as `state=` to `merged_state_dict`,
`save_merged` and `save_adapter`, and restore a single trainer's adapter with `adapter_tensors`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import sys

import torch
from safetensors.torch import load_file

# peft is imported where LoRA is used (`apply_lora` and after): it pulls in transformers' quantizer integrations
# (torchao), about 0.35 s of every trainer and reference process's start, with LoRA off

ADAPTER_DIR = "policy_adapter"  # next to a checkpoint's `policy/` (merged weights, loadable by vLLM)
_ADAPTER = "default"  # peft's adapter name
_PEFT_PREFIX = "base_model.model."  # PeftModel's names = this prefix + the wrapped model's names


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Each target must name a module (peft's rule: the full name, or a suffix after a dot)."""
    names = [n for n, _ in model.named_modules() if n]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"trainer.lora.target_modules: {missing} match no module of {type(model).__name__}; "
                         f"its linear layers are named {linear}")
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    io = (model.get_input_embeddings(), model.get_output_embeddings())
    emb = {n for n, m in model.named_modules() if any(m is e for e in io)}
    clash = [t for t in targets if any(n == t or n.endswith("." + t) for n in emb)]
    if tied and clash:
        raise ValueError(f"trainer.lora.target_modules: {clash} adapt the tied embedding / lm_head of "
                         f"{type(model).__name__}; the merged weights could no longer be tied, remove them")


def apply_lora(model: torch.nn.Module, lora_cfg) -> Optional[torch.nn.Module]:
    """Inject LoRA layers into `model` in place per `lora_cfg` (rank, alpha, dropout, target_modules).

    Returns the peft `PeftModel` wrapper (for adapter save/load) or None when `lora_cfg.rank == 0`.
    Afterwards only the `lora_A` / `lora_B` weights of `model` require gradients.
    Raises ValueError naming `trainer.lora.target_modules` when a target matches no module of the
    model, or when one adapts a tied embedding / lm_head.
    """
    if lora_cfg.rank == 0:
        return None
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = list(lora_cfg.target_modules)
    _check_targets(model, targets)
    config = PeftLoraConfig(r=int(lora_cfg.rank), lora_alpha=float(lora_cfg.alpha),
                            lora_dropout=float(lora_cfg.dropout), target_modules=targets, bias="none")
    return get_peft_model(model, config)


def _lora_layers(model: torch.nn.Module) -> dict:
    """{name: peft LoraLayer} of `model`; {} when peft's LoRA was never imported here (no layer can exist)."""
    if "peft.tuners.lora" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module, merge: bool = True,
                      state: Optional[dict[str, torch.Tensor]] = None) -> dict[str, torch.Tensor]:
    """The model's state dict as the plain (un-wrapped) HF model would have it, LoRA folded in.

    model: the transformers model with peft LoRA layers injected (`apply_lora`'s argument).
    Returns {HF name: tensor}: `<layer>.weight = base_layer.weight + get_delta_weight()` (new tensors)
    for every LoRA layer; every other entry aliases the live parameter or buffer (detached); `lora_*`
    entries are left out and `.base_layer.` is dropped from names. The model is not modified.
    state: a full (unsharded) state dict of `model` under its own names, e.g. gathered from FSDP2 ranks
    (whose live parameters are shards); the merge then reads base and adapter tensors from it and
    computes peft's `LoraLayer.get_delta_weight` formula, ``transpose(B @ A, fan_in_fan_out) * scaling``
    (LoRA, Hu et al. 2021, eq. 3), with each layer's `scaling` and `fan_in_fan_out`; `{}` (a rank other
    than 0) gives `{}`. Raises ValueError for a LoRA layer with a bias adapter or a variant (DoRA, ...)
    that has no plain `W + delta` merge, and, with `state`, for a non-Linear LoRA layer or missing keys.
    `merge=False` returns the base weights under the same names (for sizes).
    """
    if state is not None and not state:
        return {}
    merged: dict[str, torch.Tensor] = {}
    for name, layer in (_lora_layers(model) if merge else {}).items():
        if _ADAPTER in getattr(layer, "lora_variant", {}) or layer.lora_bias.get(_ADAPTER, False):
            raise ValueError(f"LoRA layer {name}: only plain LoRA (no DoRA / bias adapters) can be merged")
        if state is None:
            base = layer.get_base_layer().weight.detach()
            delta = layer.get_delta_weight(_ADAPTER)
        else:
            base, delta = _delta_from_state(name, layer, state)
        merged[f"{name}.weight"] = base + delta.to(base.dtype)
    out: dict[str, torch.Tensor] = {}
    for key, value in (model.state_dict() if state is None else state).items():
        if ".lora_" in key:
            continue
        hf = key.replace(".base_layer.", ".")
        out[hf] = merged.get(hf, value.detach())
    return out


def check_linear_only(model: torch.nn.Module) -> None:
    """Raise ValueError naming trainer.lora.target_modules when a LoRA layer of `model` is not a Linear
    one (an untied embedding, a conv): FSDP2 ranks merge from gathered tensors with the Linear formula."""
    layers = _lora_layers(model)
    if not layers:
        return
    from peft.tuners.lora import Linear as LoraLinear

    other = sorted(n for n, m in layers.items() if not isinstance(m, LoraLinear))
    if other:
        raise ValueError(f"trainer.lora.target_modules: {other[:3]} are not linear layers; with "
                         "trainer.num_workers > 1 only linear projections can be adapted")


def _delta_from_state(name: str, layer, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(base weight, delta) of LoRA layer `name` from full tensors in `state` (peft's formula, fp32)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.utils.other import transpose

    if not isinstance(layer, LoraLinear):
        raise ValueError(f"LoRA layer {name} ({type(layer).__name__}): only Linear LoRA layers merge from a "
                         "gathered state dict (trainer.num_workers > 1); adapt linear projections only")
    keys = [f"{name}.base_layer.weight", f"{name}.lora_A.{_ADAPTER}.weight", f"{name}.lora_B.{_ADAPTER}.weight"]
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"merged_state_dict: state has no {missing}: not a full state dict of this model")
    base, a, b = (state[k].detach() for k in keys)
    return base, transpose(b.float() @ a.float(), layer.fan_in_fan_out) * layer.scaling[_ADAPTER]


def save_adapter(peft_model, folder: Path, state: Optional[dict[str, torch.Tensor]] = None) -> None:
    """Write the adapter (peft format: adapter_config.json + adapter_model.safetensors) to `folder`.
    state: a full state dict of the wrapped model under its own names (FSDP2 ranks: the gathered one)."""
    kw = {} if state is None else {"state_dict": {_PEFT_PREFIX + k: v for k, v in state.items() if ".lora_" in k}}
    peft_model.save_pretrained(str(folder), safe_serialization=True, **kw)


def save_merged(model: torch.nn.Module, folder: Path, state: Optional[dict[str, torch.Tensor]] = None) -> None:
    """Write the merged weights as a full HF folder (what vLLM and `from_pretrained` load); `state` as in
    `merged_state_dict`."""
    model.save_pretrained(str(folder), state_dict=merged_state_dict(model, state=state), safe_serialization=True)


def check_no_adapter(checkpoint: Path) -> None:
    """Raise ValueError when a checkpoint written with LoRA is resumed by a full fine-tuning trainer."""
    if (Path(checkpoint) / ADAPTER_DIR).exists():
        raise ValueError(f"checkpoint {checkpoint} was written with LoRA ({ADAPTER_DIR}/ present): resume it "
                         "with the same trainer.lora settings, or start a full fine-tune from its policy/ folder")


def _read_adapter(peft_model, folder: Path) -> dict[str, torch.Tensor]:
    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the checkpoint was not written with trainer.lora.rank > 0")
    from peft import get_peft_model_state_dict

    saved = load_file(str(path))
    current = get_peft_model_state_dict(peft_model)
    if set(saved) != set(current) or any(saved[k].shape != current[k].shape for k in saved):
        raise ValueError(f"{path}: the adapter does not match trainer.lora (rank / target_modules differ "
                         "from the run that wrote it)")
    return saved


def load_adapter(peft_model, folder: Path) -> None:
    """Restore the adapter weights saved by `save_adapter` into `peft_model` (base weights untouched).

    Raises FileNotFoundError when `folder` has no adapter (the checkpoint was written without LoRA) and
    ValueError when the saved adapter's tensors do not match this model's (another rank or targets).
    """
    from peft import set_peft_model_state_dict

    saved = _read_adapter(peft_model, folder)
    result = set_peft_model_state_dict(peft_model, saved)
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"{Path(folder)}: unexpected adapter tensors {result.unexpected_keys[:5]}")


def adapter_tensors(peft_model, model: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """The adapter saved by `save_adapter` in `folder` as full tensors under `model`'s own names
    (`...lora_A.default.weight`), for `set_model_state_dict` on FSDP2-sharded ranks. Raises as
    `load_adapter`."""
    saved = _read_adapter(peft_model, folder)
    names = {_PEFT_PREFIX + k.replace(f".{_ADAPTER}.", "."): k for k in model.state_dict() if ".lora_" in k}
    if set(names) != set(saved):
        raise ValueError(f"{Path(folder)}: adapter names {sorted(set(saved) ^ set(names))[:5]} do not map onto the model")
    return {names[k]: v for k, v in saved.items()}
