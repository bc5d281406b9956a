"""`rl-orch drain`: tell a running Ray cluster that some of its nodes are going, so that an elastic run lets the
rollout engines there go between steps instead of losing them mid-step (docs/elastic.md, "A node drained").

    rl-orch drain --address 10.0.0.1:6379 --host node17 --host node18 --deadline-s 300
    rl-orch drain --address 10.0.0.1:6379 --node-id 3f2a9c1b...            # Ray's hex node id
    rl-orch drain --address $FQ_RAY_IP:6379 --host $(hostname) --deadline-s 600 --wait   # a pod's preStop hook

Each node matched (by Ray node id, or by host name or IP: the nodes of a Slurm allocation) gets Ray's drain request
with reason preemption and the deadline (`ray drain-node` does the same for one node id): the node takes no new work,
an elastic run retires (or first replaces) its engines after the step it is in, and the node's raylet exits once
nothing runs on it. With --wait it returns once those nodes have left the cluster, or at the deadline. The Slurm
join job (deploy/slurm/rl_orch_join.sbatch) calls it when its allocation is about to end, the Helm chart's worker pods
from their preStop hook (`worker.drainOnStop`). Needs the cluster's token in RAY_AUTH_TOKEN (with RAY_AUTH_MODE=token)
when the cluster uses token authentication.

Exit codes: 0 every matched node accepted the request (--wait: and left); 1 a node refused it; 2 bad input (no node
matches, an unreachable address), with a message naming the option; 3 --wait: the deadline passed with a node still in
the cluster.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def add_drain_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drain", help="drain Ray nodes ahead of their end (an elastic run's engines leave first)",
                       description=__doc__.split("\n\n")[2], epilog=__doc__.split("\n\n")[3],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="the cluster's GCS address <ip>:<port> (the head's port, 6379 by default; not the dashboard "
                        "URL); default: RAY_ADDRESS")
    p.add_argument("--node-id", action="append", default=[], help="a Ray node id (hex) to drain; repeatable")
    p.add_argument("--host", action="append", default=[], help="drain the live nodes on this host name or IP; "
                                                                  "repeatable")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="seconds until the nodes go (told to the run; 0: no deadline). Ray kills nothing at the "
                        "deadline: the node's owner does")
    p.add_argument("--reason-message", default="rl-orch drain", help="recorded with the request")
    p.add_argument("--wait", action="store_true",
                   help="return once the drained nodes have left the cluster (their raylets exit when nothing runs "
                        "there), at most --deadline-s (needs one)")
    p.set_defaults(func=run_drain)


def matching_nodes(nodes: dict[str, dict], node_ids: list[str], hosts: list[str]) -> dict[str, dict]:
    """The live nodes of `nodes` ({hex id: {"address", "hostname", "alive"}}) named by id or whose host name / IP
    is one of `hosts` (a short name matches the node's full name too). Raises ValueError naming the option for an
    id that is not a live node."""
    live = {k: v for k, v in nodes.items() if v["alive"]}
    missing = [n for n in node_ids if n not in live]
    if missing:
        raise ValueError(f"--node-id {missing[0]}: not a live node of this cluster ({len(live)} live)")
    out = {k: live[k] for k in node_ids}
    for k, v in live.items():
        if any(_same_host(h, v) for h in hosts):
            out[k] = v
    return out


def _same_host(host: str, node: dict) -> bool:
    """`host` (a name or IP) names `node`: its IP, its host name, or the same short name (node17 and
    node17.cluster.local match either way; never for an IP address, whose first part is not a name)."""
    host, name = host.lower(), node["hostname"].lower()
    if host in (node["address"].lower(), name):
        return True
    return not (_is_ip(host) or _is_ip(name)) and host.split(".")[0] == name.split(".")[0] != ""


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def unmatched_hosts(nodes: dict[str, dict], hosts: list[str]) -> list[str]:
    """The `hosts` that name no live node of `nodes`."""
    return [h for h in hosts if not any(_same_host(h, v) for v in nodes.values() if v["alive"])]


def _cluster_nodes(gcs) -> dict[str, dict]:
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    alive = GcsNodeInfo.GcsNodeState.Value("ALIVE")
    return {k.hex(): {"address": v.node_manager_address, "hostname": v.node_manager_hostname,
                      "alive": v.state == alive} for k, v in gcs.get_all_node_info().items()}


def run_drain(args) -> int:
    if not args.address:
        print("rl-orch drain: --address is required (or set RAY_ADDRESS): the cluster's GCS <ip>:<port>",
              file=sys.stderr)
        return 2
    if not args.node_id and not args.host:
        print("rl-orch drain: name the nodes with --node-id or --host", file=sys.stderr)
        return 2
    if args.deadline_s < 0 or (args.wait and args.deadline_s <= 0):
        need = "> 0 with --wait" if args.wait and args.deadline_s == 0 else ">= 0"
        print(f"rl-orch drain: --deadline-s must be {need} (got {args.deadline_s:g})", file=sys.stderr)
        return 2
    from ray._raylet import GcsClient  # Ray's GCS client, as `ray drain-node` uses it
    from ray.core.generated.autoscaler_pb2 import DrainNodeReason

    try:
        gcs = GcsClient(address=args.address)
        cluster = _cluster_nodes(gcs)
        nodes = matching_nodes(cluster, args.node_id, args.host)
    except ValueError as e:
        print(f"rl-orch drain: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - an unreachable GCS, a refused token: said, exit 2
        print(f"rl-orch drain: --address {args.address}: cannot read the cluster's nodes ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    if not nodes:
        print(f"rl-orch drain: --host {' '.join(args.host)}: no live node of this cluster is on these hosts",
              file=sys.stderr)
        return 2
    for host in unmatched_hosts(cluster, args.host):
        print(f"rl-orch drain: --host {host}: no live node of this cluster is on it (left out)", file=sys.stderr)
    deadline_ms = int(time.time() * 1000 + args.deadline_s * 1000) if args.deadline_s else 0
    rc, draining = 0, []
    for node_id, node in sorted(nodes.items()):
        accepted, why = gcs.drain_node(node_id, DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                       args.reason_message, deadline_ms)
        where = f"{node['hostname']} ({node['address']}, node {node_id[:12]})"
        print(f"rl-orch drain: {where}: " + ("draining" if accepted else f"refused: {why}"), flush=True)
        rc = rc if accepted else 1
        draining += [node_id] if accepted else []
    if args.wait and draining:
        left = wait_gone(lambda: _cluster_nodes(gcs), draining, args.deadline_s)
        print("rl-orch drain: " + (f"still in the cluster at the deadline: {', '.join(n[:12] for n in left)}" if left
                                   else "the drained nodes have left the cluster"), flush=True)
        rc = rc or (3 if left else 0)
    return rc


def wait_gone(read_nodes, node_ids: list[str], timeout_s: float, poll_s: float = 2.0, sleep=time.sleep,
              clock=time.monotonic) -> list[str]:
    """Poll `read_nodes()` ({hex id: {"alive", ...}}) every `poll_s` seconds until none of `node_ids` is alive, at
    most `timeout_s` seconds. Returns the ids still alive then ([] when every node left); a failed read counts as
    nothing learned (a GCS that stopped answering is retried until the timeout)."""
    end = clock() + timeout_s
    left = list(node_ids)
    while True:
        try:
            nodes = read_nodes()
            left = [n for n in node_ids if nodes.get(n, {}).get("alive", False)]
        except Exception:  # noqa: BLE001 - the head may be busy or restarting: try again until the timeout
            pass
        if not left or clock() >= end:
            return left
        sleep(min(poll_s, max(end - clock(), 0.0)))
