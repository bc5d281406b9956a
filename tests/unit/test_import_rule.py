"""The import rule of DESIGN.md: pure modules import neither Ray, vLLM nor `actors`. `orchestrator.config` loads its
names on first use: its loader (`orchestrator.config.load`, which imports every section) is the module checked."""
import subprocess
import sys

import pytest

PURE = ["orchestrator.algo", "orchestrator.config.load", "orchestrator.config.sections", "orchestrator.weight_sync", "orchestrator.weight_sync.registry",
        "orchestrator.utils.atomic", "orchestrator.utils.finite", "orchestrator.data",
        "orchestrator.rollout.config", "orchestrator.algo.config", "orchestrator.placement.config", "orchestrator.metrics.config",
        "orchestrator.rollout", "orchestrator.reward", "orchestrator.checkpoint", "orchestrator.memory",
        "orchestrator.sizing.sizer", "orchestrator.sizing.measurements", "orchestrator.cli.size", "orchestrator.sizing.recommend", "orchestrator.placement.plan"]


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_ray_vllm_or_actors(module):
    code = (f"import sys, {module}\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'actors')]\n"
            "print(','.join(sorted(bad)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"{module} pulls in {out}"
