"""`python -m orchestrator <config.yaml> [key=value ...]` = `rl-orch run ...`."""
import sys

from orchestrator.cli import main

sys.exit(main())
