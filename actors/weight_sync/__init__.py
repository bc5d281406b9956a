"""Weight sync, the actor side: one module per strategy (sender + receiver + description, see base.py),
the vLLM worker extension that loads what receivers stream, and the collective group for broadcasts.
The registry naming the strategies is orchestrator/weight_sync/registry.py."""
