"""Weight-sync planning and verification (pure: no Ray, no vLLM)."""
from orchestrator.sync.checksum import WeightMismatchError, checksum_group, compare_checksums, group_checksums

__all__ = ["WeightMismatchError", "checksum_group", "compare_checksums", "group_checksums"]
