"""Connecting to Ray: join `run.ray_address` / $RAY_ADDRESS, or start a local Ray for this run (orchestrator/job.py
calls `connect_ray` before it starts any actor)."""
from __future__ import annotations

import contextlib
import os

import ray

from orchestrator.runtime.ray_security import loopback_node_ip, secure_auth_token

# vLLM's CPU backend repeats harmless warnings every step; users can set VLLM_LOGGING_LEVEL themselves.
QUIET_ENV = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"), "TOKENIZERS_PARALLELISM": "false"}


def connect_ray(cfg) -> bool:
    """Join `run.ray_address` / $RAY_ADDRESS, or start a local Ray with `run.num_cpus` CPUs (and, with
    placement.resource=fake_gpu and placement.fake_gpus=N > 0, the custom resource {"fake_gpu": N}; its metrics
    agent serves Prometheus on metrics.ray_export_port when that is set). A local Ray listens on 127.0.0.1 only
    (run.ray_loopback) and its auth token file is made readable by this user only (orchestrator/runtime/ray_security.py).
    Returns whether it started a local Ray (False when Ray was already initialised or a cluster was joined)."""
    if ray.is_initialized():
        return False
    address = cfg.run.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return False
    else:  # address="local": a new local Ray, never a leftover `ray start` cluster found on this machine
        p = cfg.placement
        fake = {"fake_gpu": float(p.fake_gpus)} if p.resource == "fake_gpu" and p.fake_gpus > 0 else {}
        if getattr(p, "trainer_node_resource", ""):  # one node: it holds the job group (placement.trainer_node_resource)
            fake[p.trainer_node_resource] = 1.0
        fake = fake or None
        secure_auth_token()  # Ray's token file readable by this user only (orchestrator/runtime/ray_security.py)
        with loopback_node_ip() if cfg.run.ray_loopback else contextlib.nullcontext({}) as bind:
            ray.init(address="local", num_cpus=cfg.run.num_cpus or None, include_dashboard=False, log_to_driver=True,
                     runtime_env={"env_vars": QUIET_ENV}, resources=fake,
                     _metrics_export_port=cfg.metrics.ray_export_port or None, **bind)
        return True
