"""Built-in environments with verifiable rewards: `calculator` (tool use) and `guessing` (multi-turn)."""
