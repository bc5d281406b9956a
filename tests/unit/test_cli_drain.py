"""`rl-orch drain` (orchestrator/cli/drain.py): which nodes it drains, and bad input refused before any request,
exit code 2 with a message naming the option. (Against a real cluster: tests/integration/test_elastic_nodes.py.)"""
from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.cli.drain import matching_nodes, unmatched_hosts

NODES = {"a1": {"address": "10.0.0.1", "hostname": "node17.cluster.local", "alive": True},
         "b2": {"address": "10.0.0.2", "hostname": "node18.cluster.local", "alive": True},
         "c3": {"address": "10.0.0.3", "hostname": "node18.cluster.local", "alive": False},  # a dead raylet
         "d4": {"address": "10.0.0.4", "hostname": "node19", "alive": True}}


def test_nodes_are_matched_by_id_host_name_short_name_or_ip_and_only_live_ones():
    assert set(matching_nodes(NODES, [], ["node18"])) == {"b2"}  # the short name; the dead one left out
    assert set(matching_nodes(NODES, [], ["NODE17.cluster.local", "10.0.0.4"])) == {"a1", "d4"}
    assert set(matching_nodes(NODES, ["d4"], ["node17"])) == {"a1", "d4"}
    assert matching_nodes(NODES, [], ["node20"]) == {}
    assert set(matching_nodes(NODES, [], ["node19.cluster.local"])) == {"d4"}  # Slurm's full name, Ray's short one
    assert unmatched_hosts(NODES, ["node17", "node20", "10.0.0.3"]) == ["node20", "10.0.0.3"]  # 10.0.0.3: dead
    by_ip = {"e5": {"address": "10.0.0.5", "hostname": "10.0.0.5", "alive": True},  # Ray naming nodes by IP
             "f6": {"address": "10.0.0.6", "hostname": "10.0.0.6", "alive": True}}
    assert set(matching_nodes(by_ip, [], ["10.0.0.5"])) == {"e5"}  # not every 10.* node
    with pytest.raises(ValueError, match="--node-id c3: not a live node"):
        matching_nodes(NODES, ["c3"], [])


@pytest.mark.parametrize("argv, match", [
    (["drain", "--host", "x"], "--address is required"),
    (["drain", "--address", "10.0.0.1:6379"], "name the nodes with --node-id or --host"),
    (["drain", "--address", "10.0.0.1:6379", "--host", "x", "--deadline-s", "-1"], "--deadline-s must be >= 0"),
])
def test_bad_input_exits_2_naming_the_option(argv, match, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_wait_returns_when_the_drained_nodes_left_or_at_the_deadline_naming_those_still_there():
    from orchestrator.cli.drain import wait_gone

    now, reads = [0.0], []

    def sleep(s):
        now[0] += s

    def read():  # a1 leaves at t=4; d4 never; the GCS fails once
        reads.append(now[0])
        if len(reads) == 2:
            raise ConnectionError("GCS busy")
        return {**NODES, "a1": {**NODES["a1"], "alive": now[0] < 4}}

    assert wait_gone(read, ["a1"], 30, poll_s=2, sleep=sleep, clock=lambda: now[0]) == []
    assert reads == [0, 2, 4]
    now[0] = 0.0
    assert wait_gone(read, ["a1", "d4"], 7, poll_s=2, sleep=sleep, clock=lambda: now[0]) == ["d4"]
    assert now[0] == 7


def test_wait_needs_a_deadline(capsys):
    assert main(["drain", "--address", "10.0.0.1:6379", "--host", "x", "--wait"]) == 2
    assert "--deadline-s must be > 0 with --wait (got 0)" in capsys.readouterr().err
