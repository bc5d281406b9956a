"""Partial rollouts on the in-process vLLM engine: generation that a weight update interrupts and that
continues on the new weights, keeping the tokens already sampled (orchestrator/rollout/partial.py).

    gen = InterruptibleEngine(vllm_engine)
    gen.add(samples, version=3)                 # PartialSamples: prompt + tokens so far, the budget left
    done = gen.step()                           # one engine step: new tokens stamped with version 3
    ...
    paused = gen.interrupt()                    # weight update: abort every in-flight request (tokens kept)
    vllm_engine.update_weights(...)             # loads version 4 and drops the prefix cache
    gen.add(paused, version=4)                  # continue: prompt + tokens so far, KV recomputed by version 4

Each request is added with `LLMEngine.add_request` (a `TokensPrompt` of the sample's continuation prompt,
`sampling.sampling_params` of the rollout config with max_tokens=remaining, output_kind=DELTA and the
sample's segment seed) and stepped with `LLMEngine.step()`; DELTA outputs carry each step's new ids and their logprobs, appended to
the sample with the version the engine held when the segment was added. `interrupt` calls
`LLMEngine.abort_request`, which frees the requests' KV blocks, so the load's prefix-cache reset succeeds
and a continued request never reads KV computed by older weights (its whole prefix is prefilled again by
the new weights; `VLLMEngine.update_weights` raises when the reset fails). The engine is stepped by the
caller between updates: the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) runs the model inside
`step()`, so every token sampled is delivered before `step()` returns and an abort between steps loses
nothing. vLLM's AsyncLLM offers the same for a separate engine process (`pause_generation(mode="abort")`).
"""
from __future__ import annotations

import itertools
from typing import Optional

from orchestrator.rollout.partial import PartialSample

_IDS = itertools.count()


class InterruptibleEngine:
    """Segments of PartialSamples on one `VLLMEngine` (see the module docstring).

    Args:
        engine: a `VLLMEngine` (uses ``engine.llm.llm_engine``, ``engine.cfg`` temperature / top_p /
            ignore_eos, ``engine.tokenizer``).
    Attributes:
        interruptions: requests aborted by `interrupt` so far; steps: engine steps run; prompt_tokens /
        cached_tokens: prompt ids of the requests that finished, and of those the ones vLLM served from its prefix
        cache (`RequestOutput.num_cached_tokens`; computed prefill = prompt_tokens - cached_tokens). Counted per
        engine (several engines in one process are counted apart), cumulative ints.
    """

    def __init__(self, engine):
        self.llm = engine.llm  # vllm.LLM: its LLMEngine is stepped here (AsyncRequests: an AsyncLLM)
        self.cfg, self.tokenizer = engine.cfg, engine.tokenizer
        self.active: dict[str, tuple[PartialSample, int]] = {}  # request id -> (sample, weight version)
        self.prompt_len: dict[str, int] = {}  # request id -> its prompt's ids (the continuation prompt's)
        self.interruptions = self.steps = self.prompt_tokens = self.cached_tokens = 0

    @property
    def running(self) -> int:
        return len(self.active)

    def samples(self) -> list[PartialSample]:
        """The samples in flight (the engine's requests), in the order they were added."""
        return [s for s, _ in self.active.values()]

    def add(self, samples: list[PartialSample], version: int) -> None:
        """Start (or continue) each unfinished sample as one engine request on weight `version`.
        Raises ValueError for a finished sample or one already in flight."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from actors.rollout.sampling import sampling_params

        keys = {s.key for s, _ in self.active.values()}
        for s in samples:
            if s.done or s.key in keys:
                raise ValueError(f"sample {s.key}: {'finished' if s.done else 'already in flight'}, cannot be added")
            params = sampling_params(self.cfg, 1, s.seed, s.request.sampling, max_tokens=s.remaining,
                                     output_kind=RequestOutputKind.DELTA)
            rid = f"partial-{next(_IDS)}"
            self._add_request(rid, TokensPrompt(prompt_token_ids=s.prompt_ids), params)
            self.active[rid] = (s, int(version))
            self.prompt_len[rid] = len(s.prompt_ids)
            keys.add(s.key)

    def step(self) -> list[PartialSample]:
        """One engine step. Returns the samples that finished in it (done: "stop" or "length")."""
        finished = []
        for out in self._outputs():
            entry = self.active.get(out.request_id)
            if entry is None:  # an aborted request's last output
                continue
            sample, version = entry
            c = out.outputs[0]
            ids = list(c.token_ids)
            sample.extend(ids, [d[t].logprob for t, d in zip(ids, c.logprobs or [])], version)
            if out.finished:
                del self.active[out.request_id]
                self.prompt_tokens += self.prompt_len.pop(out.request_id, 0)
                self.cached_tokens += int(out.num_cached_tokens or 0)
                sample.finish(c.finish_reason if c.finish_reason in ("stop", "length") else "length")
                if sample.done:
                    finished.append(sample)
                else:  # cannot happen with max_tokens = remaining; never lose a sample if it does
                    self.add([sample], version)
        self.steps += 1
        return finished

    def run(self, max_steps: Optional[int] = None) -> list[PartialSample]:
        """Step until nothing is in flight (or `max_steps` steps ran); the samples that finished."""
        done: list[PartialSample] = []
        while self.active and (max_steps is None or max_steps > 0):
            done += self.step()
            max_steps = None if max_steps is None else max_steps - 1
        return done

    def interrupt(self) -> list[PartialSample]:
        """Abort every in-flight request (a weight update is next); returns their samples, tokens so far kept,
        each counted in `PartialSample.interruptions`."""
        if not self.active:
            return []
        ids = list(self.active)
        self._abort(ids)
        samples = [self.active.pop(rid)[0] for rid in ids]
        for rid in ids:
            self.prompt_len.pop(rid, None)
        for s in samples:
            s.interrupted()
        self.interruptions += len(samples)
        return samples

    # ---- the engine's side (`AsyncRequests`, actors/rollout/async_llm_engine.py: the same over AsyncLLM) ----
    def _add_request(self, request_id: str, prompt, params) -> None:
        self.llm.llm_engine.add_request(request_id, prompt, params)

    def _outputs(self) -> list:
        """One engine step's `RequestOutput`s (DELTA: each carries the ids sampled since the last)."""
        return self.llm.llm_engine.step()

    def _abort(self, request_ids: list[str]) -> None:
        self.llm.llm_engine.abort_request(request_ids)

    def text(self, sample: PartialSample) -> str:
        """The response text of a sample as vLLM's detokenizer gives it (`LLM.generate`'s `CompletionOutput.text`):
        special tokens skipped, and trailing ids that end inside a UTF-8 character (a response cut by max_tokens)
        left out instead of decoded as U+FFFD (1 of 256 demo responses, checked against vLLM's text)."""
        ids = list(sample.response_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for _ in range(4):  # a UTF-8 character has at most 4 bytes: at most 3 trailing ids can be inside one
            if not (text.endswith("\ufffd") and ids):
                break
            ids.pop()
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text
