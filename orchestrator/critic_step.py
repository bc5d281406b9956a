"""PPO with a value model, on the controller's side: the critic's part of a step and of a checkpoint.

    critic = CriticStep(job, cfg)                  # active when algo.estimator=gae
    adv = critic.advantages(trajs, inputs, row)    # advantages phase: the critic's values -> GAE (else the estimator)
    ref = critic.start_update(batch)               # train phase: the critic trains beside the policy
    row.update(critic.finish_update(ref))          # critic/* metrics
    critic_checkpoint(job, folder, extra)          # Job.checkpoint with a critic: one atomic folder, one manifest
    restore_critic(job, folder)                    # Job.restore with a critic

The advantages phase asks the critic (actors/critic.py, its own placement bundle) for V_t of every response
token, computes GAE's advantages and returns (orchestrator/algo/gae.py), and keeps the returns and values for
the train phase, which updates the critic on them (the clipped value loss) while the trainer updates the
policy. Without a critic every call is a pass-through, so the controller reads the same either way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from orchestrator.algo import AdvantageInputs, TrainBatch, compute_token_advantages, gae_from_inputs, token_rows
from orchestrator.utils.atomic import atomic_dir
from orchestrator.checkpoint import write_manifest

CRITIC_DIR = "critic"  # the critic's folder inside a checkpoint (value_model.safetensors, critic_state.pt)


class CriticStep:
    """The critic's part of one step (module docstring); `active` is False unless algo.estimator=gae."""

    def __init__(self, job, cfg):
        self.job, self.cfg = job, cfg
        self.active = cfg.algo.estimator == "gae"
        self.returns: Optional[list[list[float]]] = None  # the last advantages phase's GAE returns, [B][len_i]
        self.values: Optional[list[list[float]]] = None  # and the critic's values they were computed with

    def advantages(self, trajs: list, inputs: AdvantageInputs, row: dict) -> torch.Tensor:
        """Advantages [B, T]: with the critic, GAE over its values (`critic/values_mean`, `critic/returns_mean`
        into `row`); without, the registered `algo.estimator` on `inputs` as before."""
        if not self.active:
            return compute_token_advantages(self.cfg.algo.estimator, inputs, self.cfg.algo)
        prompts, responses = [t.prompt_ids for t in trajs], [t.response_ids for t in trajs]
        self.values = self.job.wait(self.job.actors.critic.values.remote(prompts, responses))
        values = torch.zeros(inputs.response_mask.shape, dtype=torch.float32)
        for i, v in enumerate(self.values):
            values[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
        with_values = AdvantageInputs(inputs.rewards, inputs.group_ids, inputs.response_mask, inputs.token_rewards,
                                      values)
        adv = compute_token_advantages("gae", with_values, self.cfg.algo)  # the checked entry point
        _, returns = gae_from_inputs(with_values, self.cfg.algo)
        self.returns = token_rows(returns, responses)
        mask = inputs.response_mask != 0
        row["critic/values_mean"] = float(values[mask].mean()) if mask.any() else 0.0
        row["critic/returns_mean"] = float(returns[mask].mean()) if mask.any() else 0.0
        return adv

    def start_update(self, batch: TrainBatch):
        """Launch the critic's update on this step's batch and the returns of its advantages phase (not
        waited for); None without a critic. Raises RuntimeError when no advantages phase ran first."""
        if not self.active:
            return None
        if self.returns is None or self.values is None:
            raise RuntimeError("CriticStep.start_update before CriticStep.advantages: no returns to train on")
        ref = self.job.actors.critic.update.remote(batch.prompt_ids, batch.response_ids, self.returns, self.values,
                                                   batch.response_mask)
        self.returns, self.values = None, None
        return ref

    def finish_update(self, ref) -> dict:
        """The critic/* metrics of `start_update`'s update ({} without a critic), within run.phase_timeout_s."""
        return {} if ref is None else self.job.wait(ref)


def critic_checkpoint(job, folder: Path, extra: dict) -> str:
    """`Job.checkpoint` with a critic: the trainer's checkpoint and the critic's `critic/` folder in one temporary
    folder, the manifest rewritten over both, renamed into `folder` when complete (atomic as the trainer's
    alone: a crash leaves the previous checkpoints and at most a temporary folder, which pruning removes)."""
    with atomic_dir(folder) as tmp:
        job.wait(job.actors.trainer.save_checkpoint.remote(str(tmp), extra))  # policy, optimizer, state, manifest
        job.wait(job.actors.critic.save.remote(str(tmp / CRITIC_DIR)))
        write_manifest(tmp, step=extra.get("step", 0), base_model=str(job.model_path))  # now over critic/ too
    return str(Path(folder))


def restore_critic(job, folder: Path) -> int:
    """The critic's weights, optimizer, scheduler and step from checkpoint `folder`; returns its step. Raises
    FileNotFoundError (from the actor) when `folder` holds no critic (a checkpoint of a run without gae)."""
    return job.wait(job.actors.critic.load.remote(str(Path(folder) / CRITIC_DIR)))
