"""Run configuration: typed schema (`schema.py`) and loading with validation (`load.py`)."""
from orchestrator.config.load import ConfigError, load_config, validate
from orchestrator.config.schema import Config

__all__ = ["Config", "ConfigError", "load_config", "validate"]
