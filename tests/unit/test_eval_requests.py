"""Eval requests: their own sampling (SamplingOverride -> vLLM SamplingParams), their own seeds and group ids that
never meet training's (orchestrator/eval/runner.py; the engine driver's requests: orchestrator/rollout/partial.py
`samples_of`, actors/rollout/sampling.sampling_params as actors/rollout/interruptible.py calls it)."""
from __future__ import annotations

from transformers import AutoTokenizer

from actors.rollout.sampling import sampling_params
from orchestrator.config import load_config
from orchestrator.data import load_examples
from orchestrator.eval.runner import Evaluator
from orchestrator.utils.models import resolve_model_path
from orchestrator.rollout.partial import samples_of
from orchestrator.rollout.seeds import eval_seed, group_seed, sample_seed
from orchestrator.rollout.types import PromptRequest, SamplingOverride


def _issued(cfg, requests):
    """(request, SamplingParams) of every vLLM request the engine driver issues for `requests`."""
    samples = [s for r in requests for s in samples_of(r, cfg.n, cfg.max_new_tokens)]
    return [(s.request, sampling_params(cfg, 1, s.seed, s.request.sampling, max_tokens=s.remaining)) for s in samples]


def test_override_sets_n_temperature_and_length_per_request_and_training_requests_keep_the_config():
    cfg = load_config("configs/grpo_arith_cpu.yaml").rollout
    train = PromptRequest(group_id=3, prompt_ids=[1, 2], answer="", seed=11)
    ev = PromptRequest(group_id=-1, prompt_ids=[1, 2, 3], answer="", seed=eval_seed(1, 0),
                       sampling=SamplingOverride(n=2, temperature=0.0, max_new_tokens=5))
    issued = _issued(cfg, [train, ev])
    assert [r.group_id for r, _ in issued] == [3] * cfg.n + [-1, -1]
    t, e = issued[0][1], issued[-1][1]
    assert (t.temperature, t.max_tokens, t.seed) == (cfg.temperature, cfg.max_new_tokens, sample_seed(11, 0))
    assert (e.temperature, e.max_tokens, e.n, e.seed) == (0.0, 5, 1, sample_seed(eval_seed(1, 0), 1))
    hot = SamplingOverride(n=2, temperature=0.5, max_new_tokens=5)  # unseeded: the engine's random state
    issued = _issued(cfg, [PromptRequest(-1, [1], "", sampling=hot)])
    assert [(p.n, p.temperature, p.max_tokens, p.seed) for _, p in issued] == [(1, 0.5, 5, None)] * 2


def test_eval_seeds_and_group_ids_stay_apart_from_training():
    seeds = {eval_seed(1, i) for i in range(64)}
    train = {group_seed(0, step, step * 4 + g) for step in range(1, 17) for g in range(4)}
    assert len(seeds) == 64 and not seeds & train
    assert eval_seed(1, 5) == eval_seed(1, 5) != eval_seed(2, 5)


def test_evaluator_requests_of_the_demo_config():
    cfg = load_config("configs/grpo_arith_cpu.yaml")
    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path, cfg.model.cache_dir))
    ev = Evaluator(cfg, load_examples(cfg.data), tok)
    assert len(ev.requests) == 64 and all(r.group_id < 0 for r in ev.requests)
    assert len({r.group_id for r in ev.requests}) == 64
    assert ev.requests[0].sampling == SamplingOverride(n=1, temperature=0.0, max_new_tokens=48)
    assert [ev.due(s) for s in (0, 1, 7, 8, 9, 16)] == [True, False, False, True, False, True]
    assert ev.train_items == list(range(cfg.data.arith_size))
