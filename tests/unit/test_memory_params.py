"""Parameter counts from HF configs (orchestrator.memory.params): published counts and hand-computed MoE."""
import json

import pytest

from orchestrator.memory import PRESETS, ModelConfigError, ParamCount, count_params, load_hf_config
from orchestrator.memory.params import resolve_model_config


def test_smollm2_135m_counts_exactly():
    assert count_params(PRESETS["smollm2-135m"]) == ParamCount(134_515_008, 134_515_008)


@pytest.mark.parametrize("name,total,active", [
    ("llama3-8b", 8.03e9, 8.03e9),
    ("llama3-70b", 70.55e9, 70.55e9),
    ("qwen2.5-7b", 7.62e9, 7.62e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("deepseek-v3", 671e9, 37e9),
])
def test_presets_match_published_counts(name, total, active):
    count = count_params(PRESETS[name])
    assert count.total == pytest.approx(total, rel=0.03)
    assert count.active == pytest.approx(active, rel=0.03)


def test_exact_dense_counts():
    assert count_params(PRESETS["llama3-8b"]).total == 8_030_261_248
    assert count_params(PRESETS["qwen2.5-7b"]).total == 7_615_616_512  # with q/k/v biases


def test_untying_adds_one_embedding_matrix():
    tied = count_params(PRESETS["smollm2-135m"]).total
    untied = count_params({**PRESETS["smollm2-135m"], "tie_word_embeddings": False}).total
    assert untied - tied == 49152 * 576


# hidden 8, 2 layers, 2 heads, 1 kv head (head_dim 4), vocab 10, tied; 4 experts of 3, top-2, shared 5.
TINY_MOE = dict(model_type="qwen2_moe", hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=10, tie_word_embeddings=True, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=3, shared_expert_intermediate_size=5,
                intermediate_size=6)


def test_moe_hand_computed():
    # embed 80 + final norm 8; attention 64+32+32+64 + q/k/v bias 16 = 208, norms 16 -> base 224
    # router 8*4 + shared gate 8 = 40; shared 3*8*5 = 120; expert 3*8*3 = 72
    # layer: total 224+40+120+4*72 = 672, active 224+40+120+2*72 = 528
    assert count_params(TINY_MOE) == ParamCount(88 + 2 * 672, 88 + 2 * 528)


def test_moe_with_dense_layers():
    # decoder_sparse_step 2: layer 0 dense (224 + 3*8*6 = 368), layer 1 sparse
    assert count_params({**TINY_MOE, "decoder_sparse_step": 2}) == ParamCount(88 + 368 + 672, 88 + 368 + 528)
    assert count_params({**TINY_MOE, "mlp_only_layers": [1]}) == ParamCount(88 + 672 + 368, 88 + 528 + 368)


def test_text_config_is_used_for_multimodal_configs():
    wrapped = {"model_type": "llava", "text_config": PRESETS["llama3-8b"]}
    assert count_params(wrapped) == count_params(PRESETS["llama3-8b"])


def test_missing_key_names_the_key():
    cfg = dict(PRESETS["llama3-8b"])
    del cfg["vocab_size"]
    with pytest.raises(ModelConfigError, match="vocab_size"):
        count_params(cfg)
    with pytest.raises(ModelConfigError, match="hidden_size"):
        count_params({**PRESETS["llama3-8b"], "hidden_size": "big"})


def test_load_hf_config_from_file_and_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["smollm2-135m"]))
    assert load_hf_config(tmp_path) == PRESETS["smollm2-135m"]
    assert load_hf_config(tmp_path / "config.json") == PRESETS["smollm2-135m"]
    assert count_params(resolve_model_config(str(tmp_path))).total == 134_515_008


def test_load_hf_config_errors_name_the_path_and_key(tmp_path):
    with pytest.raises(ModelConfigError, match="missing_dir"):
        load_hf_config(tmp_path / "missing_dir")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelConfigError, match="bad.json"):
        load_hf_config(bad)
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="list.json"):
        load_hf_config(lst)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"hidden_size": 8, "vocab_size": 10}))
    with pytest.raises(ModelConfigError, match=r"partial\.json.*num_hidden_layers"):
        load_hf_config(partial)


def test_resolve_model_config_names_the_presets():
    with pytest.raises(ModelConfigError, match="llama3-70b"):
        resolve_model_config("no-such-model")
