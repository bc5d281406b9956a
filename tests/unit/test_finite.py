"""The shared "finite and >= 0" check (orchestrator/utils/finite.py) and the classes that use it: the message names the
class, the field and the bad value."""
import math
from dataclasses import dataclass

import pytest

from orchestrator.utils.finite import check_finite_nonnegative, nonnegative_problem
from orchestrator.sizing.phases import StepCosts
from orchestrator.sizing.scaling import constant
from orchestrator.sizing.stream_sim import choose_k
from orchestrator.sizing.workload import SizingError, Workload
from orchestrator.weight_sync.cost_model import SyncSetup, SyncSetupError


@dataclass
class Pair:
    a: float
    b: object


@pytest.mark.parametrize("value", [0, 0.0, 3, 2.5, 1e300])
def test_finite_nonnegative_numbers_pass(value):
    assert nonnegative_problem(value) is None
    check_finite_nonnegative(Pair(value, value))


@pytest.mark.parametrize("value", [-1, -0.5, math.inf, math.nan, True, "1", None])
def test_other_values_are_named_with_class_field_and_value(value):
    assert nonnegative_problem(value) == f"must be a finite number >= 0 (got {value!r})"
    with pytest.raises(ValueError) as info:
        check_finite_nonnegative(Pair(1.0, value))
    assert str(info.value) == f"Pair.b: must be a finite number >= 0 (got {value!r})"


def test_only_the_named_fields_with_the_given_error():
    check_finite_nonnegative(Pair(1.0, -1.0), ("a",))
    with pytest.raises(SizingError, match=r"^Pair\.b: must be a finite number >= 0 \(got -1\.0\)$"):
        check_finite_nonnegative(Pair(1.0, -1.0), ("b",), SizingError)


def test_users_of_the_check_name_class_field_and_value():
    with pytest.raises(ValueError, match=r"^StepCosts\.sync_s: must be a finite number >= 0 \(got nan\)$"):
        StepCosts(generate_s=1.0, train_s=1.0, sync_s=math.nan)
    with pytest.raises(SizingError, match=r"^Workload\.recompute_s: must be a finite number >= 0 \(got -2\.0\)$"):
        Workload(constant(1.0), constant(1.0), recompute_s=-2.0)
    with pytest.raises(SyncSetupError, match=r"^op_latency_s: must be a finite number >= 0 \(got inf\)$"):
        SyncSetup(num_params=1e9, num_engines=1, gpus_per_engine=1, engine_nodes=0, op_latency_s=math.inf)
    with pytest.raises(ValueError, match=r"^tolerance: must be a finite number >= 0 \(got -0\.1\)$"):
        choose_k(StepCosts(generate_s=1.0, train_s=1.0), tolerance=-0.1)
