"""Sizing (pure: no Ray, no vLLM): scaling laws fitted to measured phase times, a pipeline simulator of
the placement modes, and the sizer that picks the trainer/rollout/reference split (`rl-orch size`).

Modules: scaling (laws and their fit), simulator (steady-state step time of a mode), workload (laws +
splits), sizer (search, brute force, fewest GPUs), measurements (metrics.jsonl -> workload), sync_law
(the sync law from orchestrator.weight_sync.cost_model for another cluster).
"""
