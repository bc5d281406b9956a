"""Weight-sync cost model (orchestrator.weight_sync.cost_model): hand-computed values and sanity anchors."""
import math

import pytest

from orchestrator.weight_sync import (FABRICS, SyncSetup, SyncSetupError, choose_strategy, predict_sync,
                                      setup_from_fabric, priced_names)

STRATEGIES = priced_names()  # the strategies with a predictor

# B = 1e9 params * 2 bytes = 2e9 bytes in every hand-computed case below.
BASE = dict(num_params=1e9, bytes_per_param=2, intra_gbps=10.0, inter_gbps=5.0, memcpy_gbps=10.0, store_gbps=10.0,
            pack_gbps=100.0, load_gbps=20.0, encode_gbps=10.0, decode_gbps=20.0, op_latency_s=0.01,
            fs_write_gbps=2.0, fs_read_gbps=10.0)


def test_fabrics_are_line_rates_in_gb_per_s():
    assert FABRICS["ib400"] == 50.0 and FABRICS["ib200"] == 25.0
    assert FABRICS["eth25"] == 3.125 and FABRICS["eth100"] == 12.5
    assert FABRICS["nvlink"] == 450.0 and FABRICS["pcie4"] == 25.0 and FABRICS["pcie5"] == 50.0
    assert "loopback" in FABRICS


def test_nccl_hand_computed():
    s = SyncSetup(**BASE, num_engines=2, gpus_per_engine=1, engine_nodes=1, bucket_mb=1000)
    e = predict_sync(s)["nccl"]
    # link = min(10, 5) = 5 GB/s; bucket = 1000 MiB = 1.048576e9 B -> 2 buckets
    # max(2e9/100e9, 2e9/5e9) = 0.4; first pack 1.048576e9/100e9; 2 * (0.01 + 2 * 524288 / 5e9)
    transfer = 0.4 + 0.01048576 + 2 * (0.01 + 2 * 524288 / 5e9)
    assert e.transfer_s == pytest.approx(transfer, rel=1e-12)
    assert e.load_s == pytest.approx(0.1)
    assert e.seconds == pytest.approx(transfer + 0.1)
    assert e.bytes_moved == pytest.approx(2 * 2e9)


def test_nccl_on_one_node_uses_the_intra_link():
    s = SyncSetup(**{**BASE, "op_latency_s": 0.0, "pack_gbps": 1e6, "load_gbps": 1e6}, engine_nodes=0)
    assert predict_sync(s)["nccl"].seconds == pytest.approx(2e9 / 10e9, rel=1e-2)  # + ring fill


def test_disk_hand_computed():
    s = SyncSetup(**BASE, num_engines=2, gpus_per_engine=2, engine_nodes=2)
    e = predict_sync(s)["disk"]
    # write 2e9/2e9 = 1 s; 4 readers * 2e9 / 10e9 = 0.8 s; load 0.1 s
    assert e.transfer_s == pytest.approx(1.8) and e.seconds == pytest.approx(1.9)
    assert e.bytes_moved == pytest.approx(2e9 * (1 + 4))


def test_object_store_hand_computed():
    s = SyncSetup(**BASE, num_engines=2, gpus_per_engine=2, engine_nodes=2)
    e = predict_sync(s)["object_store"]
    # 2 * 0.01 + put 0.2 + 2 nodes * 2e9 / 5e9 = 0.8 + local read 0.2; load 0.1
    assert e.transfer_s == pytest.approx(1.22) and e.seconds == pytest.approx(1.32)
    assert e.bytes_moved == pytest.approx(2e9 * (1 + 2 + 4))


def test_delta_hand_computed_and_fallback():
    s = SyncSetup(**BASE, num_engines=2, gpus_per_engine=2, engine_nodes=2, changed_fraction=0.03)
    e = predict_sync(s)["delta"]
    payload = 0.03 * 1e9 * 2.2  # compressed_bytes_per_changed defaults to 1.1 * 2
    transfer = 0.02 + payload / 10e9 + 2 * payload / 5e9 + payload / 10e9
    assert e.encode_s == pytest.approx(0.2) and e.decode_s == pytest.approx(0.1)
    assert e.transfer_s == pytest.approx(transfer) and e.seconds == pytest.approx(0.2 + transfer + 0.1 + 0.1)
    fallback = predict_sync(SyncSetup(**BASE, num_engines=2, gpus_per_engine=2, engine_nodes=2,
                                      changed_fraction=0.6))["delta"]
    assert fallback.decode_s == 0.0 and fallback.seconds == pytest.approx(0.2 + 1.22 + 0.1)
    assert "fallback" in fallback.notes


@pytest.mark.parametrize("engines,gpus,nodes", [(1, 1, 0), (8, 8, 8), (4, 2, 3), (64, 1, 16)])
def test_seconds_is_the_sum_of_the_phases(engines, gpus, nodes):
    s = setup_from_fabric(7e9, 2, engines, gpus, nodes, changed_fraction=0.05)
    for name, e in predict_sync(s).items():
        assert e.strategy == name and e.notes
        assert e.seconds == pytest.approx(e.encode_s + e.transfer_s + e.decode_s + e.load_s)
    assert set(predict_sync(s)) == set(STRATEGIES)


def test_70b_over_ib400_needs_at_least_the_wire_time():
    s = setup_from_fabric(70e9, 2, num_engines=8, gpus_per_engine=8, engine_nodes=8, inter="ib400")
    assert predict_sync(s)["nccl"].seconds >= 140e9 / 50e9  # 2.8 s
    ideal = setup_from_fabric(70e9, 2, 8, 8, 8, inter="ib400", op_latency_s=0.0, pack_gbps=1e6, load_gbps=1e6)
    assert predict_sync(ideal)["nccl"].seconds == pytest.approx(2.8, rel=0.15)
    assert predict_sync(ideal)["nccl"].seconds >= 2.8


def test_more_engines_never_make_nccl_faster():
    for nodes in (0, 1, 4):
        times = [predict_sync(setup_from_fabric(70e9, 2, n, 8, nodes if n >= nodes else n))["nccl"].seconds
                 for n in range(1, 33)]
        assert all(b >= a for a, b in zip(times, times[1:]))
        assert times[-1] < 2 * times[0]  # the ring's bandwidth term does not grow with receivers


def test_disk_grows_with_engine_gpus_at_fixed_aggregate_read():
    times = [predict_sync(setup_from_fabric(8e9, 2, n, 2, 1, fs_read_gbps=20.0))["disk"].seconds
             for n in (1, 2, 4, 8, 16)]
    assert all(b > a for a, b in zip(times, times[1:]))


def test_delta_wins_on_slow_ethernet_only_when_few_elements_change():
    small = setup_from_fabric(7e9, 2, 4, 1, 4, intra="pcie4", inter="eth25", changed_fraction=0.03)
    est = predict_sync(small)
    assert est["delta"].seconds < est["nccl"].seconds
    assert choose_strategy(small) == "delta"
    for fallback in (0.5, 1.0):  # all changed: with or without the fallback to a full send
        full = setup_from_fabric(7e9, 2, 4, 1, 4, intra="pcie4", inter="eth25", changed_fraction=1.0,
                                 max_changed_fraction=fallback)
        est = predict_sync(full)
        assert est["delta"].seconds > est["nccl"].seconds


@pytest.mark.parametrize("setup", [
    setup_from_fabric(135e6, 2, 1, 1, 0, intra="loopback", inter="loopback"),
    setup_from_fabric(70e9, 2, 8, 8, 8),
    setup_from_fabric(7e9, 2, 4, 1, 4, inter="eth25", changed_fraction=0.03),
    setup_from_fabric(8e9, 2, 2, 1, 0, fs_write_gbps=100.0, fs_read_gbps=1000.0, load_gbps=1e6),
])
def test_choose_strategy_is_the_argmin(setup):
    est = predict_sync(setup)
    assert choose_strategy(setup) == min(est, key=lambda k: est[k].seconds)
    for subset in (("disk", "object_store"), ("nccl",), ("delta", "disk")):
        assert choose_strategy(setup, subset) == min(subset, key=lambda k: est[k].seconds)


def test_choose_strategy_rejects_unknown_candidates():
    s = setup_from_fabric(7e9, 2, 1, 1, 0)
    for bad in ((), ("nccl", "carrier_pigeon")):
        with pytest.raises(ValueError, match="candidates"):
            choose_strategy(s, bad)


@pytest.mark.parametrize("field,value", [
    ("num_params", 0), ("num_params", 1.5), ("num_params", float("nan")), ("bytes_per_param", 0),
    ("num_engines", 0), ("gpus_per_engine", 0), ("gpus_per_engine", True), ("engine_nodes", -1),
    ("engine_nodes", 5), ("intra_gbps", 0.0), ("inter_gbps", -1.0), ("inter_gbps", float("inf")),
    ("fs_write_gbps", 0), ("fs_read_gbps", "fast"), ("memcpy_gbps", 0), ("pack_gbps", 0), ("load_gbps", 0),
    ("bucket_mb", 0), ("op_latency_s", -0.1), ("changed_fraction", 1.5), ("changed_fraction", -0.01),
    ("encode_gbps", 0), ("decode_gbps", 0), ("compressed_bytes_per_changed", 0),
    ("max_changed_fraction", 2.0),
])
def test_bad_inputs_raise_value_error_naming_the_field(field, value):
    kwargs = dict(num_params=1e9, num_engines=2, gpus_per_engine=2, engine_nodes=1)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field) as info:
        SyncSetup(**kwargs)
    assert isinstance(info.value, SyncSetupError) and info.value.field == field


def test_setup_from_fabric_names_unknown_fabrics_and_fields():
    with pytest.raises(ValueError, match="intra"):
        setup_from_fabric(7e9, 2, 1, 1, 0, intra="nvlink9")
    with pytest.raises(ValueError, match="inter"):
        setup_from_fabric(7e9, 2, 1, 1, 0, inter="carrier_pigeon")
    with pytest.raises(ValueError, match="bucket_size"):
        setup_from_fabric(7e9, 2, 1, 1, 0, bucket_size=3)


def test_setup_from_fabric_fills_rates():
    s = setup_from_fabric(70e9, 2, 8, 8, 8, intra="pcie5", inter="eth100", bucket_mb=512)
    assert s.intra_gbps == 50.0 and s.inter_gbps == 12.5 and s.bucket_mb == 512
    assert s.num_params == 70_000_000_000 and isinstance(s.num_params, int)
    assert s.weight_bytes == 140e9 and s.receivers == 64
    assert s.compressed_bytes_per_changed == pytest.approx(2.2)
    cpu = setup_from_fabric(135e6, 2, 1, 1, 0, intra="loopback", inter="loopback", memcpy_gbps=7.0)
    assert cpu.pack_gbps == 7.0  # gloo on CPU packs at host memcpy speed
    assert math.isfinite(predict_sync(cpu)["nccl"].seconds)
