"""The trainer role: the policy, its optimizer and its update, and the internals it is built from.

- trainer.py: `Trainer` (one process) and its Ray actor `TrainerActor`, on the data-parallel base of the roles that
  train (actors/model/data_parallel.py, shared with the critic).
- sharded.py: `ShardedTrainer` / `ShardedTrainerActor`, D FSDP2 ranks (trainer.num_workers > 1); actors/model/fsdp.py
  holds their process group, sharding and DCP checkpoint helpers.
- moe_loss.py (router load-balancing loss), update_size.py (actor/update_ratio), finite.py (the update guard),
  warmup.py, fp8.py. The model toolkit the roles share (forward, prefix sharing, LoRA, attention, context
  parallelism): actors/model/.

Nothing is imported here: `from actors.trainer.trainer import TrainerActor`.
"""
