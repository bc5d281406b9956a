"""Faults of the controller's actors and of the controller itself, on Ray (local, CPU) with the tiny model.

A SIGKILLed trainer process is survived: the job restarts from the last checkpoint, redoes the steps after it
and logs each step once. `python -m orchestrator run` stops on SIGTERM after the step with a checkpoint (exit
143), and a SIGKILLed controller leaves no process of its local Ray behind (the watchdog, cli/watchdog.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray

from orchestrator.cli.watchdog import sweep
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def test_sigkilled_trainer_restarts_from_the_checkpoint(ray_local, tiny_model, tmp_path, monkeypatch, capsys):
    """The trainer SIGKILLed at step 4 restarts every actor from step 3's checkpoint; at step 5 the rollout worker
    dies before the sync after step 4's checkpoint pruned step 3's (keep_last=1): its replacement starts from the
    base model, not from the pruned checkpoint the job resumed from, and the sync gives it step 5's weights."""
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + [
        REWARD, "trainer.total_steps=5", "checkpoint.every_steps=1", "checkpoint.keep_last=1"])
    calls = []
    real_train = GRPOController.train

    def kill_in_train(ctl, *args):
        calls.append(1)
        if len(calls) == 4:  # step 4, first try: past the checkpoint of step 3
            pid = ray.get(ctl.actors.trainer.__ray_call__.remote(lambda actor: os.getpid()))
            os.kill(pid, signal.SIGKILL)
        if len(calls) == 6:  # step 5: the engine dies before the sync; the job's resume_from is gone
            assert not (tmp_path / "ckpt" / "step_000003").exists()
            os.kill(ray.get(ctl.job.actors.rollout[0].pid.remote()), signal.SIGKILL)
        return real_train(ctl, *args)

    monkeypatch.setattr(GRPOController, "train", kill_in_train)
    controller = GRPOController(cfg)
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    assert len(calls) == 6  # steps 1-4, then 4 again, then 5
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # the first step 4 try logged nothing, nothing twice
    assert [r["run/restarts"] for r in rows] == [0, 0, 0, 1, 1]
    assert [r["sync/engine_restarts"] for r in rows] == [0, 0, 0, 0, 1]
    assert rows[-1]["sync/version"] == 5
    out = capsys.readouterr().out
    assert "supervisor: trainer rank 0 dead (ActorDiedError" in out and "restart 1/3 from checkpoint" in out
    assert "step_000003 (step 3)" in out
    assert json.loads(open(f"{result.checkpoint}/state.json").read())["step"] == 5


def _launch(tmp_path, tiny_model, *extra) -> tuple[subprocess.Popen, Path]:
    """`python -m orchestrator run` of a 40-step tiny run in its own process (its watchdog, its local Ray); its
    output goes to `tmp_path`/log.txt (`_log`: a pipe nobody reads while the other run is checked could fill)."""
    out = tmp_path / "run"
    out.mkdir(parents=True)
    args = tiny_overrides(tiny_model, out) + [REWARD, "trainer.total_steps=40", *extra]
    with open(tmp_path / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "configs/grpo_arith_cpu.yaml", *args],
                                stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc, out


def _log(out: Path) -> str:
    return (out.parent / "log.txt").read_text(errors="replace")


def _wait_for_step_1(proc: subprocess.Popen, out: Path) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):  # step 1 done: Ray and every actor are up
        assert proc.poll() is None and time.monotonic() < deadline, _log(out)[-3000:]
        time.sleep(0.5)


def _session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


# Two runs at once, each with its own local Ray in its own session (they start in less time than two in a row):
# one gets SIGTERM, the other's controller SIGKILL. Meanwhile a bare Ray driver SIGKILLs itself: the premise of the
# watchdog (orchestrator/cli/watchdog.py), Ray's agents outlive a SIGKILLed driver (before, a test of its own that
# waited for its Ray alone).
def test_sigterm_exits_143_after_a_checkpoint_and_a_sigkilled_controller_leaves_no_process(tiny_model, tmp_path):
    term, term_out = _launch(tmp_path / "term", tiny_model)
    kill, _ = _launch(tmp_path / "kill", tiny_model)
    bare = subprocess.Popen([sys.executable, "-c", RAY_DRIVER], start_new_session=True)
    ended = {}  # when the bare driver died (a thread waits for it)
    threading.Thread(target=lambda: (bare.wait(), ended.setdefault("at", time.monotonic())), daemon=True).start()
    try:
        _wait_for_step_1(term, term_out)
        _check_sigterm_checkpoints_after_the_step_and_exits_143(term, term_out)
        _wait_for_step_1(kill, tmp_path / "kill" / "run")
        _check_sigkilled_controller_leaves_no_process_behind(kill)
        _check_ray_agents_outlive_a_sigkilled_driver(bare, ended)
    finally:
        for proc in (term, kill, bare):
            if proc.poll() is None:
                proc.kill()
        sweep(bare.pid)  # what the premise leaves (its Ray's agents), also when a check above failed


def _check_sigterm_checkpoints_after_the_step_and_exits_143(proc: subprocess.Popen, out: Path) -> None:
    proc.send_signal(signal.SIGTERM)  # to the watchdog, as scancel / a pod eviction would: forwarded
    proc.wait(timeout=120)
    log = _log(out)
    assert proc.returncode == 143, log[-3000:]
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    last = rows[-1]["step"]
    assert [r["step"] for r in rows] == list(range(1, last + 1)) and last < 40
    state = json.loads(open(f"{out}/ckpt/step_{last:06d}/state.json").read())
    assert state["step"] == last
    assert f"stopped after step {last}; resume with checkpoint.resume=" in log


def _check_sigkilled_controller_leaves_no_process_behind(proc: subprocess.Popen) -> None:
    controller = psutil.Process(proc.pid).children()[0]  # the watchdog's child: the controller, in its own session
    sid = os.getsid(controller.pid)
    before = _session_processes(sid)
    names = " ".join(p.name() for p in before)
    assert len(before) >= 4 and "raylet" in names and "gcs_server" in names, names  # Ray runs in that session
    os.kill(controller.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + 9
    left = _session_processes(sid)
    assert left == [], [(p.pid, p.cmdline()[:2]) for p in left]


RAY_DRIVER = """
import os, ray
ray.init(address="local", num_cpus=1, include_dashboard=False)
print("session", os.getsid(0), flush=True)
os.kill(os.getpid(), 9)   # a driver SIGKILLed with its local Ray up
"""


def _check_ray_agents_outlive_a_sigkilled_driver(bare: subprocess.Popen, ended: dict) -> None:
    """The premise of the watchdog: without it, Ray's agents stay after their driver's SIGKILL. That the watchdog
    leaves nothing of a SIGKILLed controller's session is checked on the real run
    (`_check_sigkilled_controller_leaves_no_process_behind`; tests/unit/test_stopping.py on a plain child)."""
    assert bare.wait(timeout=120) == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while "at" not in ended and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(max(0.0, ended.get("at", time.monotonic()) + 5 - time.monotonic()))  # the agents' own checks of
    left = _session_processes(bare.pid)  # their raylet have had 5 s since the driver died
    names = " ".join(" ".join(p.cmdline()[:1]) for p in left)
    assert "DashboardAgent" in names or "RuntimeEnvAgent" in names, (
        f"this Ray no longer leaves its agents behind a SIGKILLed driver ({names!r}): revisit the reason given in "
        "orchestrator/cli/watchdog.py and docs/fault-tolerance-supervisor.md")
