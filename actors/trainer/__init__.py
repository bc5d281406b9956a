"""The trainer role: the policy, its optimizer and its update, and the internals it is built from.

- trainer.py: `Trainer` (one process) and its Ray actor `TrainerActor`.
- sharded.py: `ShardedTrainer` / `ShardedTrainerActor`, D FSDP2 ranks (trainer.num_workers > 1); fsdp.py
  holds their process group, sharding and DCP checkpoint helpers.
- forward.py: padded and packed micro-batches and their forward passes (token logprobs).
- prefix_share.py: the GRPO shared-prompt forward (each prompt once per micro-batch).
- lora.py (peft adapters, merged weights for sync), moe_loss.py (router load-balancing loss), attention.py
  (the attention kernel choice, shared with the reference).

Nothing is imported here: `from actors.trainer.trainer import TrainerActor`.
"""
