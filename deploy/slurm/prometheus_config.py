#!/usr/bin/env python3
"""A per-job Prometheus config for a run started by rl_orch.sbatch (called by the launcher; usable alone).

    python deploy/slurm/prometheus_config.py --out runs/exp1/rl_orch-123.prometheus.yml \\
        --sd-file /tmp/ray_slurm_123/prom_metrics_service_discovery.json --head 10.0.0.5 --job-id 123 \\
        --run-config configs/my_run.yaml -- metrics.prometheus_port=9400 metrics.prometheus_host=0.0.0.0
    prometheus --config.file=runs/exp1/rl_orch-123.prometheus.yml --storage.tsdb.path=runs/exp1/prometheus

The file holds the scrape jobs of deploy/prometheus/prometheus.yml (the single-machine default) with
this job's real places:
- `ray`: file service discovery from `--sd-file`, the discovery file Ray's head writes into its
  `--temp-dir` (<temp-dir>/prom_metrics_service_discovery.json, on the head node: run Prometheus there).
- `rl-orchestrator`: the controller's /metrics at <host>:<metrics.prometheus_port>, where host is the head
  node (`--head`) when the controller binds 0.0.0.0 / :: (it runs in the Ray job's entrypoint, on the
  head node), else its bind address. The port and host are read from the run's config and overrides
  (`--run-config`, with the package's own loader) or given (`--controller-port`, `--controller-host`);
  port 0 (metrics off) or a config that does not load leaves the job out, with a warning on stderr.
- `prometheus`: Prometheus itself at 127.0.0.1:9090.
- rule_files: deploy/prometheus/alerts.yml of this repository, by absolute path (`--rules` to change).

Exit code 0 when written, 2 on bad arguments (the message names the option). Standard library only,
except `--run-config`, which imports orchestrator.config.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

ALERTS = Path(__file__).resolve().parents[1] / "prometheus" / "alerts.yml"
ANY_ADDRESS = ("0.0.0.0", "::", "")


def controller_target(host: str, port: int, head: str) -> Optional[str]:
    """`host:port` Prometheus scrapes for the controller bound to `host`:`port` on the head node `head`;
    None when port is 0 (metrics off). Raises ValueError for a port outside 0..65535."""
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics.prometheus_port: must be in 0..65535 (got {port})")
    if int(port) == 0:
        return None
    where = head if host in ANY_ADDRESS else host
    return f"[{where}]:{port}" if ":" in where else f"{where}:{port}"


def metrics_from_config(config: str, overrides: Sequence[str]) -> tuple[str, int]:
    """(metrics.prometheus_host, metrics.prometheus_port) of a run config with its key=value overrides,
    loaded as the run loads it (orchestrator.config.load_config; its ConfigError names a bad key)."""
    try:
        from orchestrator.config import load_config
    except ImportError:  # not installed: the run's working dir (where `python -m orchestrator` finds it)
        sys.path.insert(0, os.getcwd())
        from orchestrator.config import load_config
    metrics = load_config(config, list(overrides)).metrics
    return str(metrics.prometheus_host), int(metrics.prometheus_port)


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(str(text))


def render(sd_file: str, rules: str, controller: Optional[str], job_id: str = "",
           scrape_interval_s: int = 15) -> str:
    """The Prometheus config as YAML text. sd_file, rules: absolute paths (ValueError otherwise);
    controller: `host:port` or None (the rl-orchestrator job is then left out)."""
    for option, path in (("--sd-file", sd_file), ("--rules", rules)):
        if not Path(path).is_absolute():
            raise ValueError(f"{option}: must be an absolute path (got {path!r})")
    if scrape_interval_s < 1:
        raise ValueError(f"--scrape-interval: must be >= 1 second (got {scrape_interval_s})")
    lines = ["# Prometheus config of one rl_orch.sbatch job, written by deploy/slurm/prometheus_config.py.",
             "# Run it on the Ray head node (the discovery file below is local to it):",
             "#   prometheus --config.file=<this file> --storage.tsdb.path=<dir>",
             "global:", f"  scrape_interval: {scrape_interval_s}s", f"  evaluation_interval: {scrape_interval_s}s",
             "  external_labels:", "    monitor: rl-orchestrator"]
    if job_id:
        lines.append(f"    slurm_job_id: {_q(job_id)}")
    lines += ["", "rule_files:", f"  - {_q(rules)}", "", "scrape_configs:"]
    if controller:
        lines += ["  # The controller's /metrics (rl_orch_*), on the Ray head node.",
                  "  - job_name: rl-orchestrator", "    scrape_interval: 5s", "    static_configs:",
                  f"      - targets: [{_q(controller)}]"]
    else:
        lines.append("  # rl-orchestrator: left out, the run serves no /metrics (metrics.prometheus_port=0)")
    lines += ["  # Ray: every node's metrics agent, the dashboard, the autoscaler, from the head's discovery file.",
              "  - job_name: ray", "    file_sd_configs:", f"      - files: [{_q(sd_file)}]",
              "        refresh_interval: 30s",
              "  - job_name: prometheus", "    static_configs:", "      - targets: [\"127.0.0.1:9090\"]", ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where to write the config")
    p.add_argument("--sd-file", required=True, help="Ray's prom_metrics_service_discovery.json (absolute)")
    p.add_argument("--head", default="127.0.0.1", help="the Ray head node's address (the controller's host)")
    p.add_argument("--job-id", default="", help="Slurm job id, an external label")
    p.add_argument("--rules", default=str(ALERTS), help="alert rules file (absolute)")
    p.add_argument("--scrape-interval", type=int, default=15, help="seconds")
    p.add_argument("--controller-host", default="127.0.0.1", help="metrics.prometheus_host (without --run-config)")
    p.add_argument("--controller-port", type=int, default=0, help="metrics.prometheus_port (without --run-config)")
    p.add_argument("--run-config", help="the run's YAML config; the remaining arguments are its overrides")
    p.add_argument("overrides", nargs="*", help="with --run-config: key.path=value overrides")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        host, port = args.controller_host, args.controller_port
        if args.run_config:
            try:
                host, port = metrics_from_config(args.run_config, args.overrides)
            except Exception as e:  # noqa: BLE001 - the run reports a bad config itself; the file still helps
                print(f"prometheus_config: warning: {args.run_config}: {e}; the rl-orchestrator scrape job is "
                      "left out", file=sys.stderr)
                port = 0
        elif args.overrides:
            raise ValueError(f"overrides {args.overrides} need --run-config")
        target = controller_target(host, port, args.head)
        text = render(args.sd_file, str(Path(args.rules).resolve()), target, args.job_id, args.scrape_interval)
    except ValueError as e:
        print(f"prometheus_config: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"controller target: {target or 'none (metrics.prometheus_port=0)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
