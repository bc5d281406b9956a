"""Test-suite wide:
- `gpu`-marked tests are skipped where CUDA is not available;
- a local Ray kept between modules (tests/integration/conftest.py, `ray_local`) is shut down before any test that
  does not use that fixture;
- at the end, the total time and the slowest tests of each tier (docs/testing.md keeps the budget per tier).
"""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import PurePosixPath

import pytest

TIERS = ("unit", "integration", "e2e", "deploy", "gpu")
SLOWEST_PER_TIER = 15
_START = time.time()


def _tier(nodeid: str) -> str:
    parts = PurePosixPath(nodeid.split("::")[0]).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "other"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures: a Ray kept by a previous module's `ray_local` goes, unless this test uses that
    same fixture (a module that defines its own `ray_local` gets no kept Ray either)."""
    from tests.integration import conftest as integration

    if not integration.KEPT["ray"]:
        return
    own = getattr(getattr(item, "module", None), "ray_local", integration.ray_local)  # a module's own fixture
    if "ray_local" not in getattr(item, "fixturenames", ()) or own is not integration.ray_local:
        integration.shut_down_kept_ray()


def pytest_sessionfinish(session, exitstatus):
    from tests.integration import conftest as integration

    integration.shut_down_kept_ray()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The wall time of this pytest run and, per tier, its summed test time and its slowest tests (setup, call and
    teardown together; with xdist the reports reach the controller from its workers)."""
    if hasattr(config, "workerinput"):
        return
    seconds: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport):
                seconds[rep.nodeid] += rep.duration
    if not seconds:
        return
    by_tier: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for nodeid, s in seconds.items():
        by_tier[_tier(nodeid)].append((s, nodeid))
    write = terminalreporter.write_line
    terminalreporter.section("test time per tier")
    for tier in sorted(by_tier, key=lambda t: -sum(s for s, _ in by_tier[t])):
        tests = sorted(by_tier[tier], reverse=True)
        write(f"{tier}: {len(tests)} tests, {sum(s for s, _ in tests):.0f} s of test time; slowest:")
        for s, nodeid in tests[:SLOWEST_PER_TIER]:
            write(f"  {s:8.1f} s  {nodeid}")
    write(f"wall time of this pytest run: {time.time() - _START:.0f} s")
