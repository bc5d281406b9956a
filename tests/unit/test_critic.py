"""The critic (actors/critic.py) on a tiny random Llama, plain torch (no Ray): value positions, the update,
micro-batch invariance, the non-finite guard and checkpoint save / load."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from actors.critic import STATE_FILE, WEIGHTS_FILE, Critic

V = 97


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("tiny_value_llama")
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def _critic(model_dir, mbs: int = 2, lr: float = 1e-2, updates: int = 1, **algo) -> Critic:
    ccfg = SimpleNamespace(lr=lr, warmup_steps=0, weight_decay=0.0, grad_clip=1.0, micro_batch_size=mbs,
                           updates_per_step=updates)
    acfg = SimpleNamespace(**{"value_clip": 0.2, "loss_agg": "token-mean", **algo})
    return Critic(str(model_dir), ccfg, acfg, max_new_tokens=8, num_threads=1)


PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
RESPONSES = [[11, 12], [13, 14, 15], [16], [17, 18, 19, 20]]
RETURNS = [[1.0, 1.0], [0.0, 0.0, 0.0], [1.0], [0.5, 0.5, 0.5, 0.5]]


def test_fresh_values_are_zero_and_shaped_per_response(model_dir):
    values = _critic(model_dir).values(PROMPTS, RESPONSES)
    assert [len(v) for v in values] == [2, 3, 1, 4]
    assert all(x == 0.0 for row in values for x in row)  # the zero-initialised head


def test_value_of_token_t_sees_only_the_tokens_before_it(model_dir):
    """V_t is read where token t is predicted (shifted coordinates): it does not change when later tokens
    change or go, and it depends on the prompt."""
    c = _critic(model_dir)
    torch.nn.init.normal_(c.model.head.weight, std=0.5)
    full = c.values([[1, 2, 3]], [[11, 12, 13, 14]])[0]
    assert c.values([[1, 2, 3]], [[11, 12]])[0] == pytest.approx(full[:2], abs=1e-5)
    assert c.values([[1, 2, 3]], [[11, 50, 60, 70]])[0][:2] == pytest.approx(full[:2], abs=1e-5)
    assert c.values([[1, 2, 4]], [[11, 12]])[0][0] != pytest.approx(full[0], abs=1e-5)


def test_update_moves_values_towards_the_returns(model_dir):
    c = _critic(model_dir)
    old = c.values(PROMPTS, RESPONSES)
    first = c.update(PROMPTS, RESPONSES, RETURNS, old)
    assert first["critic/value_loss"] > 0 and first["critic/skipped_updates"] == 0.0 and c.get_step() == 1
    for key in ("critic/vf_clip_frac", "critic/explained_var", "critic/grad_norm", "critic/lr"):
        assert key in first
    for _ in range(15):
        c.update(PROMPTS, RESPONSES, RETURNS, c.values(PROMPTS, RESPONSES))
    last = c.update(PROMPTS, RESPONSES, RETURNS, c.values(PROMPTS, RESPONSES))
    assert last["critic/value_loss"] < 0.5 * first["critic/value_loss"]
    assert last["critic/explained_var"] > first["critic/explained_var"]


def test_update_does_not_depend_on_the_micro_batch_size(model_dir):
    old = [[0.0] * len(r) for r in RESPONSES]
    one, four = _critic(model_dir, mbs=1), _critic(model_dir, mbs=4)
    m1 = one.update(PROMPTS, RESPONSES, RETURNS, old)
    m4 = four.update(PROMPTS, RESPONSES, RETURNS, old)
    assert m1["critic/value_loss"] == pytest.approx(m4["critic/value_loss"], rel=1e-5)
    assert m1["critic/grad_norm"] == pytest.approx(m4["critic/grad_norm"], rel=1e-4)
    for a, b in zip(one.values(PROMPTS, RESPONSES), four.values(PROMPTS, RESPONSES)):
        assert a == pytest.approx(b, abs=1e-5)


def test_loss_mask_keeps_observation_tokens_out(model_dir):
    """Multi-turn: a token with response_mask 0 has no effect, whatever its return says."""
    old = [[0.0] * len(r) for r in RESPONSES]
    mask = [[1] * len(r) for r in RESPONSES]
    mask[1] = [1, 0, 1]
    wild = [list(r) for r in RETURNS]
    wild[1][1] = 1e6
    a, b = _critic(model_dir), _critic(model_dir)
    ma = a.update(PROMPTS, RESPONSES, RETURNS, old, mask)
    mb = b.update(PROMPTS, RESPONSES, wild, old, mask)
    assert ma["critic/value_loss"] == pytest.approx(mb["critic/value_loss"])
    assert a.weights_checksum() == pytest.approx(b.weights_checksum())


def test_non_finite_return_skips_the_update(model_dir, capsys):
    c = _critic(model_dir)
    before = c.weights_checksum()
    bad = [list(r) for r in RETURNS]
    bad[0][0] = float("nan")
    m = c.update(PROMPTS, RESPONSES, bad, [[0.0] * len(r) for r in RESPONSES])
    assert m["critic/skipped_updates"] == 1.0 and c.get_step() == 0 and c.weights_checksum() == before
    assert "critic: update skipped" in capsys.readouterr().out


def test_save_and_load_restore_weights_optimizer_and_step(model_dir, tmp_path):
    c = _critic(model_dir)
    for _ in range(2):
        c.update(PROMPTS, RESPONSES, RETURNS, c.values(PROMPTS, RESPONSES))
    c.save(str(tmp_path / "critic"))
    assert sorted(p.name for p in (tmp_path / "critic").iterdir()) == sorted([WEIGHTS_FILE, STATE_FILE])
    fresh = _critic(model_dir)
    assert fresh.load(str(tmp_path / "critic")) == 2
    for a, b in zip(c.values(PROMPTS, RESPONSES), fresh.values(PROMPTS, RESPONSES)):
        assert a == pytest.approx(b, abs=1e-6)
    # the same next update on both: the optimizer state came back too
    c.update(PROMPTS, RESPONSES, RETURNS, [[0.0] * len(r) for r in RESPONSES])
    fresh.update(PROMPTS, RESPONSES, RETURNS, [[0.0] * len(r) for r in RESPONSES])
    assert c.weights_checksum() == pytest.approx(fresh.weights_checksum(), rel=1e-7)
    with pytest.raises(FileNotFoundError, match="holds no critic"):
        fresh.load(str(tmp_path / "nothing"))


def test_updates_per_step_takes_that_many_optimizer_steps(model_dir):
    c = _critic(model_dir, updates=3)
    m = c.update(PROMPTS, RESPONSES, RETURNS, [[0.0] * len(r) for r in RESPONSES])
    assert c.get_step() == 3 and m["critic/skipped_updates"] == 0.0
    single = _critic(model_dir).update(PROMPTS, RESPONSES, RETURNS, [[0.0] * len(r) for r in RESPONSES])
    assert m["critic/explained_var"] == pytest.approx(single["critic/explained_var"])  # before any update: V = 0
    assert m["critic/value_loss"] < single["critic/value_loss"]  # the mean over 3 passes, the later ones lower
