"""The model toolkit the role actors share (trainer, critic, reference): the batched forward and its logprobs
(forward.py, policy_forward.py), the shared-prompt forward (prefix_share.py), context parallelism
(context_parallel.py), attention kernel choice (attention.py), FSDP2 sharding (fsdp.py) and the ranks' collectives
(collectives.py), the data-parallel base of the roles that train (data_parallel.py: one rank or D, rank 0 the
leader that fans calls out, leader.py), LoRA adapters (lora.py). The role actors live in actors/trainer/, actors/critic*.py and
actors/reference*.py."""
