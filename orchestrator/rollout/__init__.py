"""Rollout-side types and routing (pure: no Ray, no vLLM)."""
from orchestrator.rollout.types import PromptRequest, Trajectory

__all__ = ["PromptRequest", "Trajectory"]
