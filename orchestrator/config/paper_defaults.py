"""Each estimator and policy loss runs with its paper's settings unless the user sets them.

A registered method declares the ``algo`` keys that define it (``Registry.register(settings=, source=)``,
orchestrator/algo/registry.py): GSPO and GSPO-token ``loss_agg=seq-mean-token-mean`` and their clip range,
Dr. GRPO its constant token-sum normaliser, CISPO ``token-mean`` without a lower weight bound. ``load_config``
calls ``apply_paper_settings`` on the merged config before validating it:

- a declared key the user did not set (in the YAML file or an override) takes the paper's value, logged once;
- a declared key the user set to another value keeps the user's value and warns once, naming the paper's;
- two chosen methods that declare one key differently (``algo.estimator=dr_grpo`` with ``algo.policy_loss=gspo``)
  are refused unless the user sets that key: ValueError naming both choices.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from orchestrator.algo import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

log = logging.getLogger(__name__)
_SAID: set[str] = set()  # messages already logged in this process (a run loads its config more than once)
_SELECTORS = (("estimator", ADVANTAGE_ESTIMATORS), ("policy_loss", POLICY_LOSSES))


def declared_keys(algo) -> set[str]:
    """The dotted ``algo.*`` keys that the chosen estimator and policy loss declare."""
    return {f"algo.{key}" for _, _, settings in _chosen(algo) for key in settings.values}


def apply_paper_settings(algo, explicit: set[str], say: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Set the chosen methods' paper settings on ``algo`` (the merged, writable ``algo`` section) where the user
    did not set them; warn where the user set them otherwise.

    Args:
        algo: the config's ``algo`` node (OmegaConf, not read-only yet).
        explicit: dotted keys the user set (``set_keys`` of the YAML file and the overrides).
        say: ``(level, message)`` sink; default: this module's logger, each message once per process.

    Returns:
        ``{key: value}`` applied from the papers.
    Raises:
        ValueError: a declared key that is not an ``algo`` key, or two chosen methods declaring one key
            differently while the user sets neither (the message names both choices and the key to set).
    """
    say = say or say_once
    wanted: dict[str, tuple[Any, str, str]] = {}
    for selector, name, settings in _chosen(algo):
        for key, value in settings.values.items():
            chooser = f"algo.{selector}={name}"
            if key not in algo:
                raise ValueError(f"{chooser}: its settings name {key!r}, which is not an algo key")
            if f"algo.{key}" in explicit:
                if algo[key] != value:
                    say(logging.WARNING, f"algo.{key}={algo[key]!r} is set against {chooser}'s paper, which uses "
                                         f"{value!r} ({settings.source}); the run uses {algo[key]!r}")
                continue
            other = wanted.get(key)
            if other is not None and other[0] != value:
                raise ValueError(f"{other[1]} and {chooser} define algo.{key} differently ({other[0]!r} in "
                                 f"{other[2]}; {value!r} in {settings.source}); set algo.{key} to choose")
            wanted[key] = (value, chooser, settings.source)
    applied = {}
    for key, (value, chooser, source) in wanted.items():
        if algo[key] != value:
            algo[key] = value
            applied[key] = value
            say(logging.INFO, f"algo.{key}={value!r}: the setting of {chooser} ({source})")
    return applied


def _chosen(algo):
    for selector, registry in _SELECTORS:
        name = algo[selector]
        settings = registry.settings(name) if name in registry else None
        if settings is not None:
            yield selector, name, settings


def say_once(level: int, message: str) -> None:
    """Log `message` at `level` unless this process logged it already (a run loads its config more than once)."""
    if message not in _SAID:
        _SAID.add(message)
        log.log(level, message)
