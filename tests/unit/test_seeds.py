"""orchestrator/rollout/seeds.py: per-request sampling seeds, a pure function of (seed, step, group, sample)."""
from __future__ import annotations

import subprocess
import sys

from orchestrator.rollout.seeds import group_seed, request_seed, sample_seed, splitmix64, turn_seed


def test_splitmix64_matches_the_reference_sequence():
    # SplitMix64 seeded with 0: the first outputs of the reference C code (state += golden; mix(state))
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_seeds_are_fixed_numbers_in_63_bits():
    # pinned values: a change here changes every run's samples (and breaks resuming older runs exactly)
    assert request_seed(0, 1, 2, 0) == sample_seed(group_seed(0, 1, 2), 0) == 7502013268491376801
    assert turn_seed(7502013268491376801, 3) == 5768287657703692633
    seeds = [request_seed(s, st, g, i) for s in (0, 1, -5) for st in (0, 1, 7) for g in (0, 3, 10**12) for i in range(8)]
    assert all(0 <= x < 2**63 for x in seeds)
    assert len(set(seeds)) == len(seeds)  # every input a different seed
    assert 0 <= turn_seed(request_seed(0, 1, 2, 0), 3) < 2**63


def test_each_input_changes_the_seed():
    base = request_seed(0, 3, 6, 1)
    assert len({base, request_seed(1, 3, 6, 1), request_seed(0, 4, 6, 1), request_seed(0, 3, 7, 1),
                request_seed(0, 3, 6, 2)}) == 5
    # the inputs are not interchangeable (no plain sum or xor of them)
    assert request_seed(0, 3, 6, 1) != request_seed(0, 6, 3, 1) != request_seed(0, 3, 1, 6)
    assert group_seed(0, 1, 2) != group_seed(0, 2, 1)
    s = sample_seed(group_seed(0, 1, 2), 0)
    assert len({turn_seed(s, t) for t in range(16)}) == 16 and turn_seed(s, 0) != s


def test_seeds_are_the_same_in_another_process():
    code = "from orchestrator.rollout.seeds import request_seed; print(request_seed(42, 5, 21, 3))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)})
    assert int(out.stdout) == request_seed(42, 5, 21, 3)


def test_sample_seeds_of_a_group_are_well_spread():
    # 10 000 seeds: bits balanced (each bit set in ~half), no collisions
    seeds = [request_seed(0, step, g, i) for step in range(25) for g in range(50) for i in range(8)]
    assert len(set(seeds)) == len(seeds)
    for bit in range(63):
        frac = sum((s >> bit) & 1 for s in seeds) / len(seeds)
        assert 0.46 < frac < 0.54, bit
