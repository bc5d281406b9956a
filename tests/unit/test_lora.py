"""LoRA in the Trainer (actors/model/lora.py) on a tiny random Llama: only adapters train, merged weights are
peft's merge, checkpoints round-trip, bad targets and settings fail clearly."""
from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from actors.trainer.trainer import Trainer
from tests.unit.trainer_helpers import random_batch, save_tiny_llama
from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.config.schema import AlgoConfig, TrainerConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_lora"))


def _batch(n=8, seed=0):
    return random_batch(n, seed)


def _trainer(tiny, rank=4, targets=None, **over):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32", **over})
    tc.lora.rank = rank
    if targets is not None:
        tc.lora.target_modules = targets
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


def _params(t):
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def test_one_update_changes_only_adapter_weights(tiny):
    t = _trainer(tiny)
    trainable = {n for n, p in t.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {id(p) for g in t.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in t.model.parameters() if p.requires_grad}
    before = _params(t)
    t.train_step(_batch())
    after = _params(t)
    base = [k for k in before if ".lora_" not in k]
    adapters = [k for k in before if ".lora_" in k]
    assert all(torch.equal(before[k], after[k]) for k in base), "a base weight changed"
    # B starts at zero and moves; the policy (merged weights) therefore changes too
    assert all(not torch.equal(before[k], after[k]) for k in adapters if ".lora_B." in k)


def test_merged_sync_weights_equal_peft_merge_and_unload(tiny):
    t = _trainer(tiny)
    t.train_step(_batch(seed=3))
    named, meta = t.weights_for_sync("float32")
    reference = copy.deepcopy(t.peft).merge_and_unload().state_dict()
    got = dict(named)
    assert set(got) == set(reference) - {"lm_head.weight"}  # tied head left out, as without LoRA
    for k, v in got.items():
        assert torch.allclose(v, reference[k].to(v.device), atol=1e-7, rtol=0), k  # the sync's tensors are on the CPU
    changed = [k for k in got if not torch.equal(got[k], load_base(tiny)[k])]
    assert changed and all(k.endswith("_proj.weight") for k in changed)
    assert meta["bytes"] == sum(v.numel() * 4 for v in got.values()) == t.sync_size("float32")[1]
    # exporting did not touch the live model: a second export is identical and no layer is marked merged
    again = dict(t.weights_for_sync("float32")[0])
    assert all(torch.equal(again[k], got[k]) for k in got)
    assert not any(getattr(m, "merged", False) for m in t.model.modules())


def load_base(tiny):
    return AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).state_dict()


def test_checkpoint_round_trip_keeps_policy_a_full_hf_model(tiny, tmp_path):
    a = _trainer(tiny, warmup_steps=2, total_steps=10)
    a.train_step(_batch(seed=1))
    a.save_checkpoint(str(tmp_path / "ck"), {"step": 1})
    assert (tmp_path / "ck" / "policy_adapter" / "adapter_model.safetensors").is_file()
    policy = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ck" / "policy"), dtype=torch.float32).state_dict()
    merged = dict(a.weights_for_sync("float32")[0])
    assert all(torch.equal(policy[k], v) for k, v in merged.items())
    b = _trainer(tiny, warmup_steps=2, total_steps=10)
    assert b.load_checkpoint(str(tmp_path / "ck")) == {"step": 1}
    assert b.step == 1 and b.scheduler.get_last_lr() == a.scheduler.get_last_lr()
    ma, mb = a.train_step(_batch(seed=2)), b.train_step(_batch(seed=2))
    assert ma["actor/loss"] == pytest.approx(mb["actor/loss"], abs=1e-6)
    pa, pb = _params(a), _params(b)
    assert all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)
    # the kinds do not mix: a full fine-tune refuses a LoRA checkpoint and vice versa
    with pytest.raises(ValueError, match="written with LoRA"):
        _trainer(tiny, rank=0).load_checkpoint(str(tmp_path / "ck"))
    _trainer(tiny, rank=0).save_checkpoint(str(tmp_path / "full"), {})
    with pytest.raises(FileNotFoundError, match="trainer.lora.rank"):
        _trainer(tiny).load_checkpoint(str(tmp_path / "full"))


def test_target_module_that_matches_nothing_fails_naming_the_key(tiny):
    with pytest.raises(ValueError, match=r"trainer\.lora\.target_modules: \['qkv_proj'\]"):
        _trainer(tiny, targets=["q_proj", "qkv_proj"])
    with pytest.raises(ValueError, match="tied"):
        _trainer(tiny, targets=["lm_head"])


@pytest.mark.parametrize("override, message", [
    ("trainer.lora.rank=-1", "trainer.lora.rank"), ("trainer.lora.alpha=0", "trainer.lora.alpha"),
    ("trainer.lora.dropout=1.0", "trainer.lora.dropout"), ("trainer.lora.target_modules=[]", "target_modules"),
    ("trainer.router_aux_loss_coef=-0.1", "trainer.router_aux_loss_coef")])
def test_bad_lora_and_moe_settings_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_merge_from_a_full_state_dict_equals_the_live_merge(tiny, tmp_path):
    # FSDP2 ranks (actors/trainer/sharded.py) merge from gathered full tensors instead of the live layers
    from actors.model import lora

    t = _trainer(tiny)
    t.train_step(_batch(seed=5))
    full = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    live = lora.merged_state_dict(t.model)
    folded = lora.merged_state_dict(t.model, state=full)
    assert folded.keys() == live.keys() and not any(".lora_" in k or ".base_layer." in k for k in folded)
    assert all(torch.equal(folded[k], live[k]) for k in live)
    assert lora.merged_state_dict(t.model, state={}) == {}  # ranks other than 0 gather nothing
    with pytest.raises(ValueError, match="not a full state dict"):
        lora.merged_state_dict(t.model, state={k: v for k, v in full.items() if ".lora_B." not in k})
    # the adapter written from the full state dict maps back onto the model's own names
    lora.save_adapter(t.peft, tmp_path / "a", state=full)
    back = lora.adapter_tensors(t.peft, t.model, tmp_path / "a")
    assert back.keys() == {k for k in full if ".lora_" in k}
    assert all(torch.equal(back[k], full[k].to(back[k].device)) for k in back)
