"""Name -> function registries for the algorithm seam: advantage estimators and policy losses.

A registry is filled by decorators at import time (verl registers its estimators and losses the same
way), so adding an estimator or a loss is one function in one file::

    from orchestrator.algo import register_policy_loss

    @register_policy_loss("my_loss")
    def my_loss(inputs, cfg): ...

The config's allowed values (``algo.estimator``, ``algo.policy_loss``) are read from these registries,
so the names live in one place. A user module is made known to every process that needs it (the
controller for estimators, the trainer actor for losses) by listing it in ``algo.plugins``; see
``import_plugins``. Pure Python; no Ray, no vLLM.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, Optional, TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class PaperSettings:
    """The settings that define a registered method in its paper: ``algo`` keys (without the ``algo.``
    prefix) -> values, and where they come from (paper, equation). ``load_config`` applies them unless the
    user sets the key, and warns once when the user sets one against the paper
    (orchestrator/config/paper_defaults.py)."""

    values: Mapping[str, Any]
    source: str


class Registry(Generic[F]):
    """An ordered name -> function table for one kind of algorithm part.

    Args:
        kind: what is registered, for messages ("advantage estimator", "policy loss").
        config_key: the config key that selects an entry (``"algo.estimator"``); errors name it.
    """

    def __init__(self, kind: str, config_key: str):
        self.kind, self.config_key = kind, config_key
        self._entries: dict[str, F] = {}
        self._settings: dict[str, PaperSettings] = {}

    def register(self, name: str, settings: Optional[Mapping[str, Any]] = None, source: str = "") -> Callable[[F], F]:
        """Decorator: ``@registry.register("name")`` adds the function under ``name`` and returns it unchanged.

        Args:
            settings: the ``algo`` keys (``{"loss_agg": "seq-mean-token-mean"}``) that define the method in
                its paper; ``load_config`` uses them unless the user sets them (``PaperSettings``).
            source: where ``settings`` come from ("GSPO, Zheng et al. 2025, eq. 5"); required with them.

        Raises:
            ValueError: ``name`` is empty or not a string, or already taken by another function (a
                second import of the same module under another name, or two plugins choosing one name);
                ``settings`` whose keys are not non-empty strings, or given without a ``source``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: the registered name must be a non-empty string, got {name!r}")
        paper = _paper_settings(f"{self.kind} {name!r}", settings, source)

        def decorator(fn: F) -> F:
            old = self._entries.get(name)
            if old is not None and _qualname(old) != _qualname(fn):
                raise ValueError(f"{self.config_key}: {self.kind} {name!r} is already registered by "
                                 f"{_qualname(old)}; choose another name for {_qualname(fn)}")
            self._entries[name] = fn
            if paper is not None:
                self._settings[name] = paper
            return fn

        return decorator

    def settings(self, name: str) -> Optional[PaperSettings]:
        """The paper settings registered with ``name``, or None (none declared, or not registered)."""
        return self._settings.get(name)

    def get(self, name: str) -> F:
        """The function registered as ``name``.

        Raises:
            ValueError: unknown ``name``; the message names the config key and lists the allowed values.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"{self.config_key}: unknown {self.kind} {name!r}; allowed: {list(self._entries)}") from None

    def resolve(self, name: str, plugins: Iterable[str] = ()) -> F:
        """``get(name)``, first importing ``plugins`` (``algo.plugins``) when ``name`` is not registered in
        this process yet: a Ray actor is a fresh process that has not run the driver's imports.

        Raises:
            ValueError: as ``get`` and ``import_plugins``.
        """
        if name not in self._entries:
            import_plugins(plugins)
        return self.get(name)

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order (built-ins first)."""
        return tuple(self._entries)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests restore a registry this way); a missing name is a no-op."""
        self._entries.pop(name, None)
        self._settings.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def _paper_settings(what: str, settings: Optional[Mapping[str, Any]], source: str) -> Optional[PaperSettings]:
    if not settings:
        return None
    bad = [k for k in settings if not isinstance(k, str) or not k or k.startswith("algo.")]
    if bad:
        raise ValueError(f"{what}: settings keys must be algo keys without the 'algo.' prefix, got {bad}")
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{what}: settings {dict(settings)} need a source (paper and equation)")
    return PaperSettings(MappingProxyType(dict(settings)), source)


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def import_plugins(plugins: Iterable[str], key: str = "algo.plugins") -> None:
    """Import each user module so that its ``@register_...`` decorators run in this process.

    Args:
        plugins: dotted module names (``"my_pkg.losses"``) or paths to ``.py`` files; a file is imported
            once per process under the module name ``rl_orch_plugin_<stem>_<hash of its resolved path>``.
        key: the config key, for messages.

    Raises:
        ValueError: a module that cannot be found, a file that does not exist, or a module whose own code
            raises on import (the message names ``key[i]``, the exception and, for a missing dependency of
            the plugin, that dependency).
    """
    for i, plugin in enumerate(plugins):
        where = f"{key}[{i}]={str(plugin)!r}"
        try:
            if str(plugin).endswith(".py"):
                _import_file(Path(plugin), where)
            else:
                importlib.import_module(plugin)
        except ModuleNotFoundError as e:
            inside = e.name and not str(plugin).startswith(e.name) and not str(plugin).endswith(".py")
            what = f"it imports {e.name!r}, which is not installed" if inside else f"cannot import it ({e})"
            raise ValueError(f"{where}: {what}") from None
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - the plugin's own code failed: name it, keep the traceback chained
            raise ValueError(f"{where}: importing it raised {type(e).__name__}: {e}") from e


def plugin_module_name(path: Path) -> str:
    """The module name a plugin file is imported under: its stem plus a hash of its resolved path, so two
    plugins named alike in two folders are two modules."""
    return f"rl_orch_plugin_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]}"


def _import_file(path: Path, where: str) -> None:
    if not path.is_file():
        raise ValueError(f"{where}: no such file")
    name = plugin_module_name(path)
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
