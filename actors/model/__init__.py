"""The model toolkit the role actors share (trainer, critic, reference): the batched forward and its logprobs
(forward.py, policy_forward.py), the shared-prompt forward (prefix_share.py), context parallelism
(context_parallel.py), attention kernel choice (attention.py), FSDP2 sharding (fsdp.py) and the ranks' collectives
(collectives.py), LoRA adapters (lora.py). The role actors live in actors/trainer/, actors/critic*.py and
actors/reference*.py."""
