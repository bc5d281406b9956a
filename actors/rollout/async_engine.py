"""Continuous batching over the in-process vLLM engine, for the multi-turn agent loop (asyncio).

`VLLMEngine.generate` runs one batch to completion (`LLM.generate`). A multi-turn rollout instead
has many trajectories whose turns become ready at different times (each waits on its environment).
`ContinuousBatcher` gives every turn its own request on the same engine and keeps stepping it:

    batcher = ContinuousBatcher(vllm_engine)
    ids, logprobs, finish = await batcher.generate(prompt_ids, max_tokens=32, worker=None)

`generate` adds one request (`LLMEngine.add_request` with a `TokensPrompt` and `SamplingParams(
logprobs=0, temperature, top_p, max_tokens)`, request ids unique per batcher) and awaits its future.
One driver coroutine calls `LLMEngine.step()` while requests are unfinished, resolves each request's
future when its output is finished, and yields to the event loop between steps, so a turn whose
environment replied meanwhile joins the running batch at the next step (vLLM's scheduler admits it;
no lockstep by turn). This is `LLM._run_engine` (vllm/entrypoints/common/offline.py) turned inside out.

The engine stays in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): weight sync runs inside it (see
vllm_engine.py), so AsyncLLM / a separate engine-core process is not an option here. `step()` blocks
the event loop while the model runs; environment calls run in threads (env_runner.py) meanwhile.

Logprobs are vLLM's processed logprobs of each sampled id (log_softmax(logits / T), case C03); the
ids include the EOS id when the model stopped on it, as `VLLMEngine.generate` returns them. A turn with a
`seed` gets vLLM's per-request generator (`SamplingParams(seed=...)`; on CPU the engine runs without
chunked prefill for this, see `cpu_seeded_scheduling` in vllm_engine.py); without one, the engine's
random state. Seeded turns sample the same ids whenever their logits are the same; under continuous
batching the batch around a turn depends on environment timing, so bit-exact logits are not promised.
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Any, Optional

from orchestrator.algo.sampler_support import SamplerSettings

_REQUEST_IDS = itertools.count()  # process-wide: batchers made one after another on one engine never share an id


class ContinuousBatcher:
    """The `AsyncEngine` of orchestrator/rollout/agent_loop.py over one `VLLMEngine` (see module docstring).

    Args:
        engine: a `VLLMEngine` (uses ``engine.llm.llm_engine`` and ``engine.cfg`` temperature / top_p).
        temperature, top_p: override the engine's rollout config (None = use it).
        sampling: extra `SamplingParams` keyword arguments (e.g. ``{"ignore_eos": True}`` so that every
            turn samples exactly max_tokens ids: equal work across benchmark configurations).
    Attributes:
        steps: engine steps run so far; max_running: most requests in flight at one time (both ints,
            for metrics and tests of "many trajectories at once"); prompt_tokens / cached_tokens: prompt
            ids of finished requests, and of those the ones vLLM served from its prefix cache
            (`RequestOutput.num_cached_tokens`): computed prefill = prompt_tokens - cached_tokens.
            Per batcher, so several engines in one process are counted apart.
    """

    def __init__(self, engine, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 sampling: Optional[dict] = None):
        self.llm_engine = engine.llm.llm_engine
        self.temperature = engine.cfg.temperature if temperature is None else temperature
        self.top_p = engine.cfg.top_p if top_p is None else top_p
        self.distribution = SamplerSettings.from_rollout(engine.cfg)  # its top_k and min_p too
        self._futures: dict[str, asyncio.Future] = {}
        self._driver: Optional[asyncio.Task] = None
        self.sampling = dict(sampling or {})
        self.steps, self.max_running = 0, 0
        self.prompt_tokens, self.cached_tokens = 0, 0

    async def generate(self, prompt_ids: list, max_tokens: int, worker: Any = None,
                       seed: Optional[int] = None) -> tuple[list, list, str]:
        """Sample one turn after `prompt_ids` ([P] ints). Returns ([N] ids, [N] float logprobs, "stop" |
        "length"), 1 <= N <= max_tokens. `worker` is ignored (this batcher is one worker's engine); `seed`:
        vLLM's per-request seed of this turn (None: the engine's random state).

        Raises ValueError for an empty prompt or max_tokens < 1; any engine error propagates.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if not prompt_ids or max_tokens < 1:
            raise ValueError(f"generate: need a non-empty prompt and max_tokens >= 1, got {len(prompt_ids)} "
                             f"prompt ids and max_tokens={max_tokens}")
        distribution = {**self.distribution.vllm_kwargs(), "temperature": self.temperature, "top_p": self.top_p}
        params = SamplingParams(**distribution, max_tokens=int(max_tokens), logprobs=0,
                                output_kind=RequestOutputKind.FINAL_ONLY, seed=seed, **self.sampling)
        request_id = f"mt-{next(_REQUEST_IDS)}"
        future = asyncio.get_running_loop().create_future()
        self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=[int(t) for t in prompt_ids]), params)
        self._futures[request_id] = future
        self.max_running = max(self.max_running, len(self._futures))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        output = await future
        self.prompt_tokens += len(prompt_ids)
        self.cached_tokens += int(output.num_cached_tokens or 0)
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [d[t].logprob for t, d in zip(ids, completion.logprobs)]
        return ids, logprobs, completion.finish_reason or "length"

    async def _drive(self) -> None:
        """Step the engine while any request of this batcher is unfinished; on an engine error, fail
        every waiting request with it (the agent loop then propagates it)."""
        try:
            while self._futures:
                await asyncio.sleep(0)  # let ready coroutines add their next turn before this step
                for output in self.llm_engine.step():
                    if output.finished and output.request_id in self._futures:
                        future = self._futures.pop(output.request_id)
                        if not future.done():
                            future.set_result(output)
                self.steps += 1
        except Exception as e:  # handed to every waiting request: the agent loop re-raises it
            waiting, self._futures = list(self._futures.values()), {}
            for future in waiting:
                if not future.done():
                    future.set_exception(e)
