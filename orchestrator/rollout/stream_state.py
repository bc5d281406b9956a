"""The generation state of a single-turn streaming run in its checkpoint (orchestrator/rollout/stream_source.py):
what `StreamRollouts.state_dict` adds to the untrained groups' requests, and how `load_state_dict` turns it back
into the buffer's finished samples and the samples to run. Pure Python.

    state.update(generation_state(buffer, in_flight))   # in_flight: the workers' unfinished samples (copies)
    for request, finished, to_run in restore_plan(state, requests, n, max_tokens):
        ...  # finished -> the buffer (complete groups first, in completion order); to_run -> a worker

The state: {"ready": the complete groups' ids in completion order (the order the trainer takes them),
"finished": every finished sample of every untrained group, complete or not, "in_flight": the unfinished
samples the workers held (in the engine or queued)}, each sample as `sample_state` (orchestrator/rollout/partial.py:
its ids, behaviour logprobs, per-token versions run-length encoded, finish reason, text); the two lists are packed
as the pending batches of the one-step-off pipeline are (`pack_json`, orchestrator/rollout/pending.py: compact
JSON, zlib, base64: one line in state.json; floats round-trip exactly). A sample index of a group
neither finished nor in flight (its worker was lost at the checkpoint) is generated again from nothing.

How the state is taken: each worker hands over, between two engine steps, its finished samples not drained yet
(into the buffer, as a drain: counted once) and copies of its unfinished ones (in the engine or queued; generation
goes on). A resume puts the finished samples back into the buffer and sends the in-flight ones to the workers as
continuations (tokens kept, continued on the checkpoint's weights as after a weight sync, so versions and
staleness stay right). No sample is lost or trained twice, and the tokens trained after a resume are the ones the
checkpoint held.
"""
from __future__ import annotations

from orchestrator.rollout.partial import PartialSample, sample_from_state, sample_state, samples_of
from orchestrator.rollout.pending import pack_json, unpack_json
from orchestrator.rollout.stream_buffer import GroupBuffer
from orchestrator.rollout.types import PromptRequest

STATE_KEYS = ("ready", "finished", "in_flight")


def generation_state(buffer: GroupBuffer, in_flight: list[PartialSample]) -> dict:
    """{"ready", "finished", "in_flight"} (module docstring) of `buffer`'s untrained groups and the workers'
    unfinished samples `in_flight` (JSON-serialisable; samples sorted by group id and index, then packed)."""
    groups = list(buffer.ready) + [buffer.pending[g] for g in sorted(buffer.pending)]
    return {"ready": [g.group_id for g in buffer.ready],
            "finished": pack_json([sample_state(g.samples[i]) for g in groups for i in sorted(g.samples)]),
            "in_flight": pack_json([sample_state(s) for s in sorted(in_flight, key=lambda s: (s.request.group_id,
                                                                                             s.index))])}


def unpacked(state: dict, key: str) -> list[dict]:
    """The sample states under `key` ("finished" or "in_flight") of `generation_state`'s dict. Raises ValueError
    on corrupt text."""
    return unpack_json(state[key], f"the streaming run's {key} samples")


def restore_plan(state: dict, requests: dict[int, PromptRequest], n: int,
                 max_tokens: int) -> list[tuple[PromptRequest, list[PartialSample], list[PartialSample]]]:
    """[(request, finished samples, samples to run)] per untrained group of a checkpoint's `state`: the complete
    groups first, in their completion order, then the others by group id. Samples to run: the in-flight ones as
    continuations (tokens kept; counted as interrupted once more: they continue on the restored weights as after
    a weight sync), then fresh samples (`samples_of`, n and max_tokens unless the request overrides them) for
    every index neither finished nor in flight. Raises ValueError for a sample of a group without a request, or
    a sample index that appears twice (finished and in flight, or twice in either), or corrupt packed text."""
    finished = _by_group(unpacked(state, "finished"), requests)
    running = _by_group(unpacked(state, "in_flight"), requests)
    for s in (s for group in running.values() for s in group if s.response_ids):
        s.interrupted()
    ready = [int(g) for g in state.get("ready", [])]
    order = ready + [g for g in sorted(requests) if g not in set(ready)]
    plan = []
    for gid in order:
        done, cont = finished.get(gid, []), running.get(gid, [])
        indices = [s.index for s in done + cont]
        if len(indices) != len(set(indices)):
            raise ValueError(f"checkpoint: group {gid} holds sample indices {sorted(indices)}: a sample is in it "
                             "twice (finished and in flight?); the checkpoint is inconsistent")
        fresh = [s for s in samples_of(requests[gid], n, max_tokens) if s.index not in set(indices)]
        plan.append((requests[gid], done, cont + fresh))
    return plan


def _by_group(states: list[dict], requests: dict[int, PromptRequest]) -> dict[int, list[PartialSample]]:
    out: dict[int, list[PartialSample]] = {}
    for d in states:
        gid = int(d["group_id"])
        if gid not in requests:
            raise ValueError(f"checkpoint: sample {gid}:{d['index']} belongs to no untrained group's request")
        out.setdefault(gid, []).append(sample_from_state(d, requests[gid]))
    return out
