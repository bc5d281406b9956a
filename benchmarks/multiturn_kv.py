"""Multi-turn KV reuse: sticky routing + prefix caching against round-robin and no caching.

    .venv/bin/python benchmarks/multiturn_kv.py                       # default model, G=4 n=4 T=4
    .venv/bin/python benchmarks/multiturn_kv.py --model /path/to/hf --groups 2 --n 2 --turns 3

In one process: two vLLM engines with prefix caching and two without (each an in-process `LLM`,
`VLLMEngine`), each driven by the rollout worker's engine driver (a `StreamingGenerator`, actors/rollout/stream.py,
with `StreamTurns` over it, actors/rollout/stream_episodes.py), and the agent
loop (orchestrator/rollout/agent_loop.py) over G groups x n samples x T turns. Three configurations:

- sticky+cache: every turn of a group on one engine (`StickyRouter`), prefix caching on;
- rr-nocache: every turn to the next engine in turn (round-robin), prefix caching off;
- sticky-nocache: sticky routing, prefix caching off.

All configurations do the same work: a deterministic environment with fixed observations (a long
system prompt, a per-group question, a fixed reply each turn, done after T turns), `ignore_eos` so
every turn samples exactly --max-new-tokens ids, incremental rendering. Prefill tokens computed are
vLLM's per-request numbers (prompt ids minus `RequestOutput.num_cached_tokens`), summed per engine.

Then the cost of a prefix-cache reset (what every weight sync does, vllm_engine.update_weights): the
final histories of the sticky+cache run are prefilled on their engines (1 new token each) with the
cache warm, and again right after `reset_prefix_cache()`; the difference is the extra prefill a
reset costs a multi-turn step whose histories would otherwise be reused.
Each engine steps on a thread of its own (its `StreamingGenerator`), as in a rollout worker; results before session 32
were measured with the previous driver, which stepped every engine from the agent loop's thread.

Prints one table and the ratios; results are recorded in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEM = ("You are an agent that solves tasks step by step with tools. " * 4 +
          "Tools: search(query) returns documents; read(doc_id) returns a document's text; "
          "calculate(expression) evaluates arithmetic; answer(text) ends the task. " * 6)


class FixedEnv:
    """Deterministic env: reset -> [system, user question of the group], each step -> a fixed reply;
    done after `turns` steps, reward 0. Every configuration sees exactly the same observations."""

    def __init__(self, turns: int = 4):
        self.turns, self.t = turns, 0

    def reset(self, sample: dict):
        self.t = 0
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {sample['seed']}: find the population of city {sample['seed']}."}]

    def step(self, action: str):
        self.t += 1
        return (f"Tool result {self.t}: document {self.t} lists 3 candidate numbers; read the next one.",
                0.0, self.t >= self.turns, {})


class Engines:
    """The agent loop's engine: routes a turn to engine `worker` (sticky) or to the next one (round-robin)."""

    def __init__(self, turns: list, round_robin: bool):
        self.turns, self.round_robin, self._rr = turns, round_robin, itertools.count()

    async def generate(self, prompt_ids, max_tokens, worker):
        k = next(self._rr) % len(self.turns) if self.round_robin else worker
        return await self.turns[k].generate(prompt_ids, max_tokens, worker)


def make_engines(model: str, caching: bool, block_size: int, count: int, seed: int) -> list:
    from actors.rollout.vllm_engine import VLLMEngine

    cfg = SimpleNamespace(dtype="float32", enforce_eager=True, enable_prefix_caching=caching, max_model_len=1024,
                          kv_cache_space_gib=1, gpu_memory_utilization=0.3, block_size=block_size,
                          temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, ignore_eos=True, max_new_tokens=16)
    return [VLLMEngine(model, cfg, seed=seed + k) for k in range(count)]


def run_config(name: str, engines: list, round_robin: bool, args, tokenizer) -> tuple[dict, list]:
    from actors.rollout.stream import StreamingGenerator
    from actors.rollout.stream_episodes import StreamTurns
    from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
    from orchestrator.rollout.chat_render import ChatRenderer
    from orchestrator.envs.env_runner import EnvRunner
    from orchestrator.rollout.router import StickyRouter

    for e in engines:
        e.llm.reset_prefix_cache()
    streams = [StreamingGenerator(e, 1, args.max_new_tokens, lambda: 0) for e in engines]  # ignore_eos: engine cfg
    loop = AgentLoop(Engines([StreamTurns(s) for s in streams], round_robin), EnvRunner(FixedEnv, {"turns": args.turns}, num_workers=8),
                     ChatRenderer(tokenizer, "incremental"), StickyRouter(len(engines)),
                     AgentLoopConfig(max_turns=args.turns, max_tokens=1024, max_new_tokens=args.max_new_tokens))
    groups = [GroupRequest(g, {"seed": g}, args.n) for g in range(args.groups)]
    t0 = time.perf_counter()
    trajs, metrics = loop.run_sync(groups)
    wall = time.perf_counter() - t0
    for stream in streams:
        stream.close()
    requested = sum(st.gen.prompt_tokens for st in streams)
    computed = requested - sum(st.gen.cached_tokens for st in streams)
    sampled = sum(sum(t.loss_mask) for t in trajs)
    return {"config": name, "wall_s": wall, "prefill_requested": requested, "prefill_computed": computed,
            "sampled": sampled, "turns_mean": metrics["rollout/turns_mean"], "trajectories": len(trajs),
            "engine_steps": sum(st.steps for st in streams)}, trajs


def reset_cost(engines: list, trajs: list, router_groups: dict) -> dict:
    """Prefill every final history (1 new token) on its sticky engine: warm cache vs right after a reset."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=1.0)
    per_engine: dict = {}
    for t in trajs:
        per_engine.setdefault(router_groups[t.group_id], []).append(TokensPrompt(prompt_token_ids=t.prompt_ids + t.response_ids))

    def prefill() -> tuple[float, int, int]:
        t0, requested, cached = time.perf_counter(), 0, 0
        for k, prompts in per_engine.items():
            for out in engines[k].llm.generate(prompts, params, use_tqdm=False):
                requested += len(out.prompt_token_ids)
                cached += int(out.num_cached_tokens or 0)
        return time.perf_counter() - t0, requested, requested - cached

    prefill()  # make sure every history is cached
    warm_s, requested, warm_computed = prefill()
    t0 = time.perf_counter()
    for e in engines:
        e.llm.reset_prefix_cache()
    reset_s = time.perf_counter() - t0
    cold_s, _, cold_computed = prefill()
    return {"histories": len(trajs), "history_tokens": requested, "warm_s": warm_s, "warm_computed": warm_computed,
            "after_reset_s": cold_s, "after_reset_computed": cold_computed, "reset_call_s": reset_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--engines", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers import AutoTokenizer

    from orchestrator.utils.models import resolve_model_path
    from orchestrator.rollout.router import StickyRouter

    model = str(resolve_model_path(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model)
    cached = make_engines(model, True, args.block_size, args.engines, seed=0)
    plain = make_engines(model, False, args.block_size, args.engines, seed=100)
    warm = SimpleNamespace(**{**vars(args), "groups": 1, "n": 2 * args.engines, "turns": 1})
    for engines in (cached, plain):  # first-call costs out of the measurement: every engine serves a turn
        run_config("warm-up", engines, True, warm, tokenizer)
    # the caching run goes in the middle, so that load drift on a shared machine does not favour it
    rows = [run_config("sticky-nocache", plain, False, args, tokenizer)[0]]
    sticky, trajs = run_config("sticky+cache", cached, False, args, tokenizer)
    rows = [sticky, rows[0], run_config("rr-nocache", plain, True, args, tokenizer)[0]]
    router = StickyRouter(args.engines)  # the same placement the sticky run used (fresh router, same hashing)
    groups = {g: router.assign(g) for g in range(args.groups)}
    reset = reset_cost(cached, trajs, groups)

    print(f"model={args.model} G={args.groups} n={args.n} T={args.turns} max_new_tokens={args.max_new_tokens} "
          f"block_size={args.block_size} engines={args.engines} (one process, CPU)")
    print(f"{'config':<16}{'wall_s':>9}{'prefill_req':>13}{'prefill_comp':>14}{'sampled':>9}{'turns':>7}{'steps':>7}")
    for r in rows:
        print(f"{r['config']:<16}{r['wall_s']:>9.2f}{r['prefill_requested']:>13}{r['prefill_computed']:>14}"
              f"{r['sampled']:>9}{r['turns_mean']:>7.2f}{r['engine_steps']:>7}")
    for base in rows[1:]:
        print(f"sticky+cache vs {base['config']}: prefill computed {base['prefill_computed'] / max(sticky['prefill_computed'], 1):.2f}x "
              f"fewer, rollout {base['wall_s'] / sticky['wall_s']:.2f}x faster")
    print(f"prefix-cache reset: {reset['histories']} histories, {reset['history_tokens']} tokens; warm prefill "
          f"{reset['warm_s']:.2f}s ({reset['warm_computed']} computed), after reset {reset['after_reset_s']:.2f}s "
          f"({reset['after_reset_computed']} computed); reset call {reset['reset_call_s'] * 1e3:.1f} ms; "
          f"cost of a reset = {reset['after_reset_s'] - reset['warm_s']:.2f}s of re-prefill")


if __name__ == "__main__":
    main()
